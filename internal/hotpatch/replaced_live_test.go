package hotpatch

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestSessionTargetReplaced: a session's target, a plugin, is unloaded
// and a new build of it loaded in its place (reload.c: dlclose, then
// dlopen of plugin.c built -DSWAPPED, once the go file exists). The loader
// puts it at the same address, and its plug_other holds, byte for byte,
// what plug_work's probe sites held. The session's list is the old
// plugin's: a command after the reload must be refused with nothing
// written, not applied to whatever now lies at the old addresses (before
// the fix: `enable plug_work` was OK and wrote the new plugin's
// plug_other). The same when the plugin is only unloaded: nothing is
// mapped there, and the refusal says so.
func TestSessionTargetReplaced(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	v1 := testutil.Build(t, testutil.Spec{Sources: []string{"plugin.c"}, Shared: true, Name: "plug1.so"})
	v2 := testutil.Build(t, testutil.Spec{Sources: []string{"plugin.c"}, Shared: true, Name: "plug2.so", Flags: []string{"-DSWAPPED"}})
	var list string
	for i, lib := range []string{v1.Path, v2.Path} {
		r := command(t, "coldpatch", lib)
		if r.Code != 0 {
			t.Fatal(r.Stderr)
		}
		if i == 0 {
			list = filepath.Join(filepath.Dir(lib), "plug1.json")
			if err := os.WriteFile(list, []byte(r.Stdout), 0o644); err != nil {
				t.Fatal(err)
			}
		}
	}
	prog := testutil.Build(t, testutil.Spec{Sources: []string{"reload.c"}, NoInstr: true, LDFlags: []string{"-ldl"}})
	for _, c := range []struct{ name, second, why string }{
		{"replaced", v2.Path, "another file is mapped there now"},
		{"unloaded", "-", "nothing is mapped there now"},
	} {
		t.Run(c.name, func(t *testing.T) {
			goFile := filepath.Join(t.TempDir(), "go")
			p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, prog.Path, v1.Path, c.second, goFile)
			ses, err := Open(p.Pid, []string{list}, false)
			if err != nil {
				t.Fatal(err)
			}
			closed := false
			t.Cleanup(func() { // before the process's own cleanup (see below)
				if !closed {
					ses.Close()
				}
			})
			// Every command checks: the reload may come sooner after the
			// last check than MappedWithin, and the test must not wait for it.
			ses.mappedWithin = -1
			sel, err := probelist.ParseSelector("plug_work", "")
			if err != nil {
				t.Fatal(err)
			}
			apply := func(on bool) (*Result, error) {
				return ses.Apply(context.Background(), []Action{{Enable: on, Selector: sel}}, ProtoAuto, 0)
			}
			var enabled *Result
			for _, on := range []bool{true, false} {
				res, err := apply(on)
				if err != nil || !res.OK || res.Changed != 2 {
					t.Fatalf("before the reload, enable=%v: %+v, %v", on, res, err)
				}
				if on {
					enabled = res
				}
			}
			if err := os.WriteFile(goFile, nil, 0o644); err != nil {
				t.Fatal(err)
			}
			line := p.Line()
			var base1, base2 uint64
			if c.second == "-" {
				if _, err := fmt.Sscanf(line, "unloaded %v", &base1); err != nil {
					t.Fatalf("want `unloaded BASE1`, got %q", line)
				}
			} else {
				if _, err := fmt.Sscanf(line, "reloaded %v %v", &base1, &base2); err != nil {
					t.Fatalf("want `reloaded BASE1 BASE2`, got %q", line)
				}
				t.Logf("the plugin was loaded at %#x, its new build at %#x", base1, base2)
			}
			res, err := apply(true)
			if err == nil || !errors.Is(err, ErrStale) || !strings.Contains(err.Error(), "nothing was written") || (c.second == "-" || base1 == base2) && !strings.Contains(err.Error(), c.why) {
				t.Errorf("enable plug_work after the plugin was %s: %+v, %v; want a stale list refused (%s), nothing written", c.name, res, err, c.why)
			}
			if c.second != "-" {
				// The new plugin's text is its file's: nothing of ours was
				// written into it.
				if diff := textDiff(t, p.Pid, v2.Path); diff != "" {
					t.Errorf("the new plugin was written: %s", diff)
				}
			}
			// The same with the default MappedWithin: a failed check stands
			// for nothing, so the next command checks again however soon.
			ses.mappedWithin = 0
			if _, err := apply(false); err == nil || !errors.Is(err, ErrStale) {
				t.Errorf("disable plug_work after the plugin was %s: %v", c.name, err)
			}
			// A capture's Restore (what trace and profile do at their end)
			// skips the object that is gone, says so, and writes nothing
			// there (before: refused whole as stale, and the trace lost).
			if err := ses.Restore(context.Background(), enabled); !errors.Is(err, ErrUnmapped) || errors.Is(err, ErrStale) {
				t.Errorf("Restore after the plugin was %s: %v; want ErrUnmapped alone", c.name, err)
			}
			if c.second != "-" {
				if diff := textDiff(t, p.Pid, v2.Path); diff != "" {
					t.Errorf("the new plugin was written by Restore: %s", diff)
				}
			}
			// Detach before the program ends: a tracer in this process would
			// reap its exit, which Finish waits for.
			closed = true
			if err := ses.Close(); err != nil {
				t.Fatal(err)
			}
			out, _ := p.Finish()
			if !strings.HasPrefix(out, "done 1") {
				t.Fatalf("reload: %q", out)
			}
		})
	}
}

// textDiff compares the executable mappings of path in pid with the file's
// bytes at their offsets: "" when equal, else where they first differ.
func textDiff(t *testing.T, pid int, path string) string {
	t.Helper()
	maps, err := os.ReadFile(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		t.Fatal(err)
	}
	file, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	mem, err := os.Open(fmt.Sprintf("/proc/%d/mem", pid))
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	seen := false
	for _, l := range strings.Split(string(maps), "\n") {
		f := strings.Fields(l)
		if len(f) < 6 || f[5] != path || f[1] != "r-xp" {
			continue
		}
		seen = true
		var start, end, off uint64
		fmt.Sscanf(f[0], "%x-%x", &start, &end)
		fmt.Sscanf(f[2], "%x", &off)
		n := min(end-start, uint64(len(file))-off)
		got := make([]byte, n)
		if _, err := mem.ReadAt(got, int64(start)); err != nil {
			t.Fatal(err)
		}
		want := file[off : off+n]
		if !bytes.Equal(got, want) {
			for i := range got {
				if got[i] != want[i] {
					return fmt.Sprintf("at %#x (file offset %#x): % x, the file % x", start+uint64(i), off+uint64(i), got[i:min(i+5, len(got))], want[i:min(i+5, len(want))])
				}
			}
		}
	}
	if !seen {
		t.Fatalf("%s has no r-xp mapping in pid %d", path, pid)
	}
	return ""
}

// TestSessionUnloadedMidApply: a plugin unloaded after Apply's mapped
// check (D77) passed and before its reads and writes of the sites (the
// check is skipped here for as long as the test runs, which stands for an
// unload landing in the window between the check and the accesses, or
// between a write and its read-back): the access fails with an I/O error.
// Before, that error was all Apply said, and a profile failed on it
// (TestProfilePluginUnloaded, once: `reading sites back: read 5 bytes at
// 0x...: input/output error`); now it is ErrUnmapped, as when the check
// finds the object gone, and a capture ends as for an unload.
func TestSessionUnloadedMidApply(t *testing.T) {
	testutil.RequirePtrace(t)
	hooks := hooksLib(t)
	v1 := testutil.Build(t, testutil.Spec{Sources: []string{"plugin.c"}, Shared: true, Name: "plug1.so"})
	list := testutil.ProbeList(t, filepath.Join(t.TempDir(), "plug1.json"), v1.Path)
	prog := testutil.Build(t, testutil.Spec{Sources: []string{"reload.c"}, NoInstr: true, LDFlags: []string{"-ldl"}})
	goFile := filepath.Join(t.TempDir(), "go")
	p := testutil.Start(t, []string{"LD_PRELOAD=" + hooks}, prog.Path, v1.Path, "-", goFile)
	ses, err := Open(p.Pid, []string{list}, false)
	if err != nil {
		t.Fatal(err)
	}
	closed := false
	t.Cleanup(func() {
		if !closed {
			ses.Close()
		}
	})
	ses.mappedWithin = time.Hour
	sel, err := probelist.ParseSelector("plug_work", "")
	if err != nil {
		t.Fatal(err)
	}
	apply := func(on bool) (*Result, error) {
		return ses.Apply(context.Background(), []Action{{Enable: on, Selector: sel}}, ProtoAuto, 0)
	}
	if res, err := apply(true); err != nil || !res.OK {
		t.Fatalf("before the unload: %+v, %v", res, err)
	}
	if err := os.WriteFile(goFile, nil, 0o644); err != nil {
		t.Fatal(err)
	}
	if line := p.Line(); !strings.HasPrefix(line, "unloaded ") {
		t.Fatalf("want `unloaded BASE1`, got %q", line)
	}
	res, err := apply(false)
	if err == nil || !errors.Is(err, ErrUnmapped) {
		t.Errorf("disable plug_work, the plugin unloaded after the check: %+v, %v; want ErrUnmapped", res, err)
	}
	t.Logf("%v", err)
	closed = true
	if err := ses.Close(); err != nil {
		t.Fatal(err)
	}
	if out, _ := p.Finish(); !strings.HasPrefix(out, "done 1") {
		t.Fatalf("reload: %q", out)
	}
}
