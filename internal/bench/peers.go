package bench

import (
	"bufio"
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
)

// uprobes drives tracefs directly: the kernel interface perf probe and
// bpftrace both use, without their start-up costs in the per-hit figure.
type uprobes struct {
	h      *Harness
	dir    string
	group  string
	tag    string // event-name suffix: uprobe_profile names events without their group
	once   sync.Once
	reason string
}

func newUprobes(h *Harness) *uprobes {
	return &uprobes{h: h, group: fmt.Sprintf("epbench%d", os.Getpid()), tag: strconv.Itoa(os.Getpid())}
}

// available returns "" when uprobes can be created, else why not. It mounts
// tracefs when it is missing (root only).
func (u *uprobes) available() string {
	u.once.Do(func() {
		defer u.sweep()
		for _, d := range []string{"/sys/kernel/tracing", "/sys/kernel/debug/tracing"} {
			if _, err := os.Stat(filepath.Join(d, "uprobe_events")); err == nil {
				u.dir = d
				return
			}
		}
		if os.Geteuid() != 0 {
			u.reason = "uprobes need root (tracefs is not mounted or not readable)"
			return
		}
		if out, err := exec.Command("mount", "-t", "tracefs", "nodev", "/sys/kernel/tracing").CombinedOutput(); err != nil {
			u.reason = "tracefs is not mounted and mounting it failed: " + strings.TrimSpace(string(out))
			return
		}
		if _, err := os.Stat("/sys/kernel/tracing/uprobe_events"); err != nil {
			u.reason = "the kernel has no uprobe_events (CONFIG_UPROBE_EVENTS off)"
			return
		}
		u.dir = "/sys/kernel/tracing"
	})
	return u.reason
}

// sweep removes the events an earlier harness left behind when it was
// killed: groups named epbench<pid> whose process is gone.
func (u *uprobes) sweep() {
	if u.dir == "" {
		return
	}
	b, err := os.ReadFile(filepath.Join(u.dir, "uprobe_events"))
	if err != nil {
		return
	}
	for _, l := range strings.Split(string(b), "\n") {
		f := strings.Fields(l)
		if len(f) < 2 {
			continue
		}
		ev := f[0][strings.IndexByte(f[0], ':')+1:] // group/event
		pid, ok := strings.CutPrefix(strings.SplitN(ev, "/", 2)[0], "epbench")
		if !ok {
			continue
		}
		if _, err := strconv.Atoi(pid); err != nil {
			continue
		}
		if _, err := os.Stat("/proc/" + pid); err == nil {
			continue // its harness still runs
		}
		_ = u.write(filepath.Join("events", ev, "enable"), "0")
		_ = u.write("uprobe_events", "-:"+ev)
	}
}

func (u *uprobes) write(file, line string) error {
	f, err := os.OpenFile(filepath.Join(u.dir, file), os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	_, err = f.WriteString(line + "\n")
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err != nil {
		return fmt.Errorf("tracefs %s <- %q: %w", file, line, err)
	}
	return nil
}

// add creates (and with enable, enables) a uprobe or uretprobe named
// group/event at bin's file offset off.
func (u *uprobes) add(kind, event, bin string, off uint64, enable bool) error {
	event += u.tag
	if err := u.write("uprobe_events", fmt.Sprintf("%s:%s/%s %s:%#x", kind, u.group, event, bin, off)); err != nil {
		return err
	}
	if enable {
		return u.write(filepath.Join("events", u.group, event, "enable"), "1")
	}
	return nil
}

// del disables and removes group/event.
func (u *uprobes) del(event string) {
	event += u.tag
	_ = u.write(filepath.Join("events", u.group, event, "enable"), "0")
	_ = u.write("uprobe_events", "-:"+u.group+"/"+event)
}

// hits reads uprobe_profile's hit count of group/event.
func (u *uprobes) hits(event string) (uint64, error) {
	event += u.tag
	f, err := os.Open(filepath.Join(u.dir, "uprobe_profile"))
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		// "  FILE EVENT HITS": the kernel prints the event without its group.
		if len(fs) == 3 && (fs[1] == event || fs[1] == u.group+"/"+event) {
			return strconv.ParseUint(fs[2], 10, 64)
		}
	}
	return 0, fmt.Errorf("uprobe_profile has no %s/%s", u.group, event)
}

// run times bin with a uprobe at empty() and a uretprobe on it.
func (u *uprobes) run(ctx context.Context, bin string, n int64) (microRun, error) {
	_, _, off, err := symbol(bin, "empty")
	if err != nil {
		return microRun{}, err
	}
	defer u.del("entry")
	defer u.del("exit")
	if err := u.add("p", "entry", bin, off, true); err != nil {
		return microRun{}, err
	}
	if err := u.add("r", "exit", bin, off, true); err != nil {
		return microRun{}, err
	}
	r, err := u.h.runPlain(ctx, bin, n, nil, false)
	if err != nil {
		return r, err
	}
	if r.entries, err = u.hits("entry"); err != nil {
		return r, err
	}
	r.exits, err = u.hits("exit")
	r.counted = true
	return r, err
}

var hitRe = regexp.MustCompile(`breakpoint already hit (\d+) time`)

// runGdb runs bin under gdb with a breakpoint at empty() and one at its ret,
// each with commands silent + continue, and reads the hit counts.
func (h *Harness) runGdb(ctx context.Context, bin string, n int64) (microRun, error) {
	ret, err := retOffset(bin)
	if err != nil {
		return microRun{}, err
	}
	script := fmt.Sprintf(`set pagination off
set confirm off
set startup-with-shell off
starti
break *(char *)&empty
commands
silent
continue
end
break *((char *)&empty + %d)
commands
silent
continue
end
continue
info breakpoints
`, ret)
	sf := tempFile(h.B.Dir, "gdb-*.cmd")
	if err := os.WriteFile(sf, []byte(script), 0o644); err != nil {
		return microRun{}, err
	}
	defer os.Remove(sf)
	cmd := exec.CommandContext(ctx, "gdb", "-nx", "-batch", "-x", sf, "--args", bin, strconv.FormatInt(n, 10))
	out, err := cmd.CombinedOutput()
	if err != nil {
		return microRun{}, fmt.Errorf("gdb: %v\n%s", err, tail(string(out), 2000))
	}
	lines := strings.Split(string(out), "\n")
	r, err := parseMicro(lines, n)
	if err != nil {
		return r, fmt.Errorf("%v\n%s", err, tail(string(out), 2000))
	}
	hits := hitRe.FindAllStringSubmatch(string(out), -1)
	if len(hits) != 2 {
		return r, fmt.Errorf("gdb: want two hit counts in its output:\n%s", tail(string(out), 2000))
	}
	r.entries, _ = strconv.ParseUint(hits[0][1], 10, 64)
	r.exits, _ = strconv.ParseUint(hits[1][1], 10, 64)
	r.counted = true
	return r, nil
}

func tail(s string, n int) string {
	if len(s) > n {
		return "..." + s[len(s)-n:]
	}
	return s
}
