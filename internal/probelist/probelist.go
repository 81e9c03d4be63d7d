package probelist

import (
	"bytes"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// Format and Version identify the document; Read rejects any other.
const (
	Format  = "edgeprobe-probes"
	Version = 1
)

// ErrFormat is wrapped by every error Read returns for a malformed document.
var ErrFormat = errors.New("invalid probe list")

// Placeholder styles: how an inert site is encoded.
const (
	// PlaceholderFlip keeps the instruction's length and operand and changes
	// only its first opcode byte, so one atomic byte store toggles the site.
	PlaceholderFlip = "flip"
	// PlaceholderNop replaces calls with a multi-byte NOP (and jumps with a
	// return); toggling needs a multi-byte protocol.
	PlaceholderNop = "nop"
)

// Kinds of probe.
const (
	KindEntry = "entry"
	KindExit  = "exit"
)

// Providers: which compiler instrumentation put a probe's site there.
const (
	// ProviderCyg is -finstrument-functions: calls (and tail jumps) to
	// __cyg_profile_func_enter, __cyg_profile_func_exit and clang's
	// __cyg_profile_func_enter_bare, with entry and exit sites.
	ProviderCyg = "cyg"
	// ProviderFentry is -pg -mfentry: one call to __fentry__ as the first
	// instruction of each function (after endbr64). It has entry sites only;
	// exits are produced by the runtime (see docs/probe-list.md).
	ProviderFentry = "fentry"
)

// The hooks each provider's sites reach.
const (
	HookCygEnter     = "__cyg_profile_func_enter"
	HookCygExit      = "__cyg_profile_func_exit"
	HookCygEnterBare = "__cyg_profile_func_enter_bare"
	HookFentry       = "__fentry__"
)

// providerHooks lists the hooks a probe of each provider may name.
var providerHooks = map[string][]string{
	ProviderCyg:    {HookCygEnter, HookCygExit, HookCygEnterBare},
	ProviderFentry: {HookFentry},
}

// ProviderOf returns the provider whose sites reach hook, or "".
func ProviderOf(hook string) string {
	for prov, hooks := range providerHooks {
		for _, h := range hooks {
			if h == hook {
				return prov
			}
		}
	}
	return ""
}

// Encodings of a hook site, as compiled.
const (
	EncCallRel32  = "call_rel32"  // e8 rel32
	EncJmpRel32   = "jmp_rel32"   // e9 rel32 (tail call)
	EncCallGOT    = "call_got"    // ff 15 disp32
	EncJmpGOT     = "jmp_got"     // ff 25 disp32 (tail call)
	EncAddr32Call = "addr32_call" // 67 e8 rel32 (relaxed -fno-plt call)
)

// List is one probe list: one ELF object and its hook sites.
type List struct {
	Format      string  `json:"format"`
	Version     int     `json:"version"`
	Binary      Binary  `json:"binary"`
	Placeholder string  `json:"placeholder"`
	Probes      []Probe `json:"probes"`
}

// Binary identifies the object the probe list describes.
type Binary struct {
	Path    string `json:"path"`               // absolute path when the list was made
	BuildID string `json:"build_id,omitempty"` // hex GNU build-id note; empty when the object has none
	Size    int64  `json:"size"`               // file size in bytes
	Type    string `json:"type"`               // "exec" (ET_EXEC) or "dyn" (ET_DYN: PIE or shared library)
	Soname  string `json:"soname,omitempty"`   // DT_SONAME of a shared library
}

// Probe is one hook site.
type Probe struct {
	ID       int    `json:"id"`       // dense, 0-based, in address order
	Kind     string `json:"kind"`     // KindEntry or KindExit (always KindEntry for ProviderFentry)
	Provider string `json:"provider"` // ProviderCyg or ProviderFentry
	// Function is the function the hook reports (its first argument), which
	// differs from Container where the compiler inlined an instrumented callee;
	// "sub_<hex address>" when the address has no symbol, and Container when
	// the argument could not be recovered (then Resolved is false).
	Function        string `json:"function"`
	FunctionAddress Hex    `json:"function_address,omitempty"` // ELF virtual address of Function; 0 when unresolved
	Resolved        bool   `json:"resolved"`
	Container       string `json:"container"` // symbol (or sub_<hex>) whose code holds the site
	Hook            string `json:"hook"`      // the hook symbol the active form reaches
	Address         Hex    `json:"address"`   // ELF virtual address of the site
	Offset          Hex    `json:"offset"`    // file offset of the site
	Encoding        string `json:"encoding"`  // one of the Enc* constants
	Placeholder     string `json:"placeholder"`
	Active          Bytes  `json:"active"`             // the site's bytes with the hook on
	Inert           Bytes  `json:"inert"`              // the site's bytes with the hook off
	Straddle        string `json:"straddle,omitempty"` // "k|n": k bytes before a 64-byte line boundary, n after; empty if none
	Source          string `json:"source,omitempty"`   // file:line from DWARF
}

// Hex is an unsigned integer written as a "0x..." JSON string.
type Hex uint64

func (h Hex) String() string { return "0x" + strconv.FormatUint(uint64(h), 16) }

// MarshalJSON writes h as a hex string.
func (h Hex) MarshalJSON() ([]byte, error) { return json.Marshal(h.String()) }

// UnmarshalJSON accepts only a "0x"-prefixed hex string.
func (h *Hex) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return fmt.Errorf("want a \"0x...\" hex string, got %s", b)
	}
	if !strings.HasPrefix(s, "0x") {
		return fmt.Errorf("want a \"0x...\" hex string, got %q", s)
	}
	v, err := strconv.ParseUint(s[2:], 16, 64)
	if err != nil {
		return fmt.Errorf("want a \"0x...\" hex string, got %q", s)
	}
	*h = Hex(v)
	return nil
}

// Bytes is a byte string written as space-free lowercase hex ("e8a1b2c3d4").
type Bytes []byte

func (b Bytes) String() string { return hex.EncodeToString(b) }

// MarshalJSON writes b as hex.
func (b Bytes) MarshalJSON() ([]byte, error) { return json.Marshal(b.String()) }

// UnmarshalJSON reads hex.
func (b *Bytes) UnmarshalJSON(data []byte) error {
	var s string
	if err := json.Unmarshal(data, &s); err != nil {
		return fmt.Errorf("want a hex byte string, got %s", data)
	}
	v, err := hex.DecodeString(s)
	if err != nil {
		return fmt.Errorf("want a hex byte string, got %q", s)
	}
	*b = v
	return nil
}

// Straddle returns the "k|n" split of an n-byte instruction at addr across a
// 64-byte cache line boundary, or "" when it lies within one line. Load biases
// are page-aligned, so the split at run time equals the split at addr.
func Straddle(addr uint64, n int) string {
	const line = 64
	k := line - int(addr%line)
	if k >= n {
		return ""
	}
	return fmt.Sprintf("%d|%d", k, n-k)
}

// DifferingBytes returns how many bytes of Active and Inert differ: 1 for every
// flip-form site, which hotpatch toggles with one atomic byte store.
func (p *Probe) DifferingBytes() int {
	n := 0
	for i := range p.Active {
		if p.Active[i] != p.Inert[i] {
			n++
		}
	}
	return n
}

// Validate checks the list's internal consistency; errors name the probe.
func (l *List) Validate() error {
	if err := l.Binary.validate(l.Format, l.Version, l.Placeholder); err != nil {
		return err
	}
	if l.Probes == nil {
		return badList("probes is missing")
	}
	var prevEnd uint64
	for i := range l.Probes {
		p := &l.Probes[i]
		if err := p.validate(i, l.Binary.Size); err != nil {
			return err
		}
		if uint64(p.Address) < prevEnd {
			return p.bad(i, "overlaps or precedes the previous probe")
		}
		prevEnd = uint64(p.Address) + uint64(len(p.Active))
	}
	return nil
}

func badList(format string, args ...any) error {
	return fmt.Errorf("%w: %s", ErrFormat, fmt.Sprintf(format, args...))
}

// validate checks the document's identity and the binary it describes.
func (b *Binary) validate(format string, version int, placeholder string) error {
	if format != Format {
		return badList("format is %q, want %q", format, Format)
	}
	if version != Version {
		return badList("version %d is not supported (this build reads version %d)", version, Version)
	}
	if b.Path == "" {
		return badList("binary.path is empty")
	}
	if b.Size <= 0 {
		return badList("binary.size %d is not positive", b.Size)
	}
	if b.Type != "exec" && b.Type != "dyn" {
		return badList("binary.type %q is neither \"exec\" nor \"dyn\"", b.Type)
	}
	if b.BuildID != "" {
		if _, err := hex.DecodeString(b.BuildID); err != nil {
			return badList("binary.build_id %q is not hex", b.BuildID)
		}
	}
	if placeholder != PlaceholderFlip && placeholder != PlaceholderNop {
		return badList("placeholder %q is neither %q nor %q", placeholder, PlaceholderFlip, PlaceholderNop)
	}
	return nil
}

func (p *Probe) bad(i int, format string, args ...any) error {
	return badList("probes[%d] (id %d at %s): %s", i, p.ID, p.Address, fmt.Sprintf(format, args...))
}

// validate checks one probe, the i-th of a list of a size-byte binary, on
// its own; its order among the others is the list's to check.
func (p *Probe) validate(i int, size int64) error {
	if p.ID != i {
		return p.bad(i, "id is %d, want %d (ids are dense and in order)", p.ID, i)
	}
	if p.Kind != KindEntry && p.Kind != KindExit {
		return p.bad(i, "kind %q is neither %q nor %q", p.Kind, KindEntry, KindExit)
	}
	hooks, ok := providerHooks[p.Provider]
	if !ok {
		return p.bad(i, "provider %q is neither %q nor %q", p.Provider, ProviderCyg, ProviderFentry)
	}
	if ProviderOf(p.Hook) != p.Provider {
		return p.bad(i, "hook %q is not a %s hook (%s)", p.Hook, p.Provider, strings.Join(hooks, ", "))
	}
	if p.Provider == ProviderFentry {
		if p.Kind != KindEntry {
			return p.bad(i, "an fentry probe is an entry probe: the binary has no fentry exit site (exits come from the runtime)")
		}
		if p.Encoding != EncCallRel32 && p.Encoding != EncCallGOT && p.Encoding != EncAddr32Call {
			return p.bad(i, "an fentry site is a call, not %s", p.Encoding)
		}
	}
	if p.Function == "" || p.Container == "" {
		return p.bad(i, "function and container must be named")
	}
	if p.Placeholder != PlaceholderFlip && p.Placeholder != PlaceholderNop {
		return p.bad(i, "placeholder %q is neither %q nor %q", p.Placeholder, PlaceholderFlip, PlaceholderNop)
	}
	want, ok := encodingLength[p.Encoding]
	if !ok {
		return p.bad(i, "unknown encoding %q", p.Encoding)
	}
	if len(p.Active) != want || len(p.Inert) != want {
		return p.bad(i, "%s site has %d active and %d inert bytes, want %d", p.Encoding, len(p.Active), len(p.Inert), want)
	}
	if p.DifferingBytes() == 0 {
		return p.bad(i, "active and inert bytes are equal")
	}
	if p.Placeholder == PlaceholderFlip && p.DifferingBytes() != 1 {
		return p.bad(i, "flip placeholder differs from the active form in %d bytes, want 1", p.DifferingBytes())
	}
	if uint64(p.Address)+uint64(want) < uint64(p.Address) {
		return p.bad(i, "runs past the end of the address space")
	}
	if uint64(p.Offset) > uint64(size) || uint64(size)-uint64(p.Offset) < uint64(want) {
		return p.bad(i, "offset %s lies past the end of the %d-byte binary", p.Offset, size)
	}
	if s := Straddle(uint64(p.Address), want); s != p.Straddle {
		return p.bad(i, "straddle is %q, want %q", p.Straddle, s)
	}
	return nil
}

// encodingLength is the length in bytes of each site encoding.
var encodingLength = map[string]int{
	EncCallRel32:  5,
	EncJmpRel32:   5,
	EncCallGOT:    6,
	EncJmpGOT:     6,
	EncAddr32Call: 6,
}

// EncodingLength returns the byte length of a site encoding, or 0 if unknown.
func EncodingLength(enc string) int { return encodingLength[enc] }

// Read decodes and validates a probe list. Unknown fields are errors, so a
// typo or a list from a newer version is refused rather than half-understood.
func Read(r io.Reader) (*List, error) {
	dec := json.NewDecoder(r)
	dec.DisallowUnknownFields()
	var l List
	if err := dec.Decode(&l); err != nil {
		var se *json.SyntaxError
		if errors.As(err, &se) {
			return nil, fmt.Errorf("%w: JSON syntax error at byte %d: %v", ErrFormat, se.Offset, err)
		}
		return nil, fmt.Errorf("%w: %v", ErrFormat, err)
	}
	if dec.More() {
		return nil, fmt.Errorf("%w: trailing data after the JSON document", ErrFormat)
	}
	if err := l.Validate(); err != nil {
		return nil, err
	}
	return &l, nil
}

// ReadFile reads the probe list at path; errors name the file.
// It reads only a regular file, bounded (OpenFile).
func ReadFile(path string) (*List, error) {
	f, r, err := OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	l, err := Read(r)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	return l, nil
}

// Write encodes l as indented JSON with a trailing newline.
func (l *List) Write(w io.Writer) error {
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	if err := enc.Encode(l); err != nil {
		return err
	}
	_, err := w.Write(buf.Bytes())
	return err
}

// WriteFile writes l to path through a temporary file and a rename, so a
// reader never sees half a list.
func (l *List) WriteFile(path string) error {
	var buf bytes.Buffer
	if err := l.Write(&buf); err != nil {
		return err
	}
	return WriteFileAtomic(path, buf.Bytes(), 0o644)
}

// WriteFileAtomic writes data to path via a temporary file in the same
// directory, fsync and rename: readers see the old file or the new one.
// The file gets mode less the process's umask, as os.WriteFile's would.
func WriteFileAtomic(path string, data []byte, mode os.FileMode) error {
	// By descriptor in the directory Walk found (procfs, D99): another
	// user's link in /tmp on the way is refused, and a directory swapped
	// for one meanwhile does not redirect the temporary or the rename.
	e, err := procfs.Walk(path)
	if err != nil {
		return err
	}
	defer e.Close()
	tmp, name, err := e.CreateTemp()
	if err != nil {
		return err
	}
	defer e.RemoveTemp(name) // no-op after a successful rename
	if _, err := tmp.Write(data); err != nil {
		tmp.Close()
		return err
	}
	// The mode as a plain create would make it: the user's umask applies
	// (a trace's argument values or a profile in a file made 0644 under
	// umask 077 would be readable by every local user).
	if err := tmp.Chmod(mode &^ procfs.Umask()); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Sync(); err != nil {
		tmp.Close()
		return err
	}
	if err := tmp.Close(); err != nil {
		return err
	}
	return e.Replace(name)
}
