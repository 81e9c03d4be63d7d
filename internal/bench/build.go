package bench

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"

	"github.com/edgeprobe/edgeprobe/internal/coldpatch"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
)

// Builder compiles the benchmark targets into Dir, caching each by a hash of
// its command line and sources, and remembers every command for the report.
type Builder struct {
	Root string // repository root (holds go.mod and bench/)
	Dir  string // output directory

	mu       sync.Mutex
	commands []string
}

// NewBuilder returns a builder writing into dir (created if missing).
func NewBuilder(root, dir string) (*Builder, error) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return nil, err
	}
	return &Builder{Root: root, Dir: dir}, nil
}

// FindRoot walks up from dir to the directory holding go.mod.
func FindRoot(dir string) (string, error) {
	dir, err := filepath.Abs(dir)
	if err != nil {
		return "", err
	}
	for d := dir; ; d = filepath.Dir(d) {
		if _, err := os.Stat(filepath.Join(d, "go.mod")); err == nil {
			if _, err := os.Stat(filepath.Join(d, "bench")); err == nil {
				return d, nil
			}
		}
		if d == filepath.Dir(d) {
			return "", fmt.Errorf("no go.mod with a bench/ directory above %s", dir)
		}
	}
}

// Build runs cc with args on sources (paths relative to the root, or
// absolute) and returns the binary's path, Dir/name. The command is recorded
// with OUT standing for the output.
func (b *Builder) Build(name, cc string, args []string, sources ...string) (string, error) {
	full := append([]string(nil), args...)
	h := sha256.New()
	for _, s := range sources {
		p := s
		if !filepath.IsAbs(p) {
			p = filepath.Join(b.Root, s)
		}
		data, err := os.ReadFile(p)
		if err != nil {
			return "", err
		}
		h.Write(data)
		full = append(full, p)
	}
	// Headers under bench/ count too: any source may include them.
	hdrs, _ := filepath.Glob(filepath.Join(b.Root, "bench", "*.h"))
	for _, p := range hdrs {
		data, _ := os.ReadFile(p)
		h.Write(data)
	}
	line := cc + " " + strings.Join(args, " ") + " " + strings.Join(sources, " ") + " -o " + name
	fmt.Fprintln(h, line, toolVersion(cc))
	out := filepath.Join(b.Dir, name)
	stamp := out + ".hash"
	sum := hex.EncodeToString(h.Sum(nil))
	b.record(line)
	if old, err := os.ReadFile(stamp); err == nil && string(old) == sum {
		if _, err := os.Stat(out); err == nil {
			return out, nil
		}
	}
	cmd := exec.Command(cc, append(full, "-o", out)...)
	cmd.Dir = b.Root
	if msg, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("%s: %v\n%s", line, err, msg)
	}
	return out, os.WriteFile(stamp, []byte(sum), 0o644)
}

// Cold makes every hook site of bin inert with the given placeholder, writing
// Dir/<name>, and returns the cold binary and its probe list.
func (b *Builder) Cold(bin, name, placeholder string) (string, *probelist.List, error) {
	out := filepath.Join(b.Dir, name)
	res, err := coldpatch.Run(bin, coldpatch.Options{Placeholder: placeholder, Output: out})
	if err != nil {
		return "", nil, fmt.Errorf("coldpatch %s: %w", bin, err)
	}
	b.record(fmt.Sprintf("coldpatch (placeholder %s) %s -> %s: %d probes", placeholder, filepath.Base(bin), name, len(res.List.Probes)))
	return out, res.List, nil
}

func (b *Builder) record(line string) {
	b.mu.Lock()
	defer b.mu.Unlock()
	for _, l := range b.commands {
		if l == line {
			return
		}
	}
	b.commands = append(b.commands, line)
}

// Commands returns every build command run or reused, in order.
func (b *Builder) Commands() []string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return append([]string(nil), b.commands...)
}

var versionCache sync.Map

func toolVersion(cc string) string {
	if v, ok := versionCache.Load(cc); ok {
		return v.(string)
	}
	out, _ := exec.Command(cc, "--version").Output()
	v := strings.SplitN(string(out), "\n", 2)[0]
	versionCache.Store(cc, v)
	return v
}
