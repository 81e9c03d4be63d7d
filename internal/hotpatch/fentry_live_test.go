package hotpatch

// Live tests of the fentry provider: mt.c compiled with -pg -mfentry and
// linked with fentry_count.S, whose __fentry__ counts its calls, toggled by
// the real hotpatch command while four threads run the sites.

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// fentrySubject is a running -pg -mfentry fixture: fentry counts __fentry__
// calls (0 when glibc's __fentry__ serves the program).
type fentrySubject struct {
	*subject
	fentry uint64
}

// startFentry builds mt.c per spec with -pg -mfentry, coldpatches it, and
// starts it. ownHook links fentry_count.S; cyg adds -finstrument-functions
// with the counting hooks preloaded.
func startFentry(t *testing.T, spec testutil.Spec, ownHook, cyg, useList bool) *fentrySubject {
	t.Helper()
	spec.Sources = []string{"mt.c"}
	if ownHook {
		spec.Sources = append(spec.Sources, "fentry_count.S")
	}
	spec.Profile, spec.NoInstr = testutil.ProfileFentry, !cyg
	var env []string
	hooks := ""
	if cyg {
		hooks = hooksLib(t)
		env = []string{"LD_PRELOAD=" + hooks}
	}
	fx := testutil.Build(t, spec)
	r := command(t, "coldpatch", fx.Path)
	if r.Code != 0 {
		t.Fatalf("coldpatch: %s\n%s", r.Stderr, fx.Command)
	}
	s := &fentrySubject{subject: &subject{}}
	if useList {
		list := filepath.Join(t.TempDir(), "probes.json")
		if err := os.WriteFile(list, []byte(r.Stdout), 0o644); err != nil {
			t.Fatal(err)
		}
		s.probeArgs = []string{"--probes", list}
	}
	s.Process = testutil.Start(t, env, fx.Path)
	s.progress = s.Symbol(fx.Path, "progress")
	if ownHook {
		s.fentry = s.Symbol(fx.Path, "fentry_calls")
	}
	if cyg {
		s.enters, s.exits = s.Symbol(hooks, "enters"), s.Symbol(hooks, "exits")
	}
	return s
}

// expect asserts which counters move while the workers run: the fentry
// count, and the cyg hooks' enters and exits (when the program has them).
func (s *fentrySubject) expect(t *testing.T, what string, fentry, enters, exits bool) {
	t.Helper()
	read := func() [3]uint64 {
		var c [3]uint64
		for i, a := range []uint64{s.fentry, s.enters, s.exits} {
			if a != 0 {
				c[i] = s.Read64(a)
			}
		}
		return c
	}
	s.AwaitProgress(s.progress, 2000)
	a := read()
	s.AwaitProgress(s.progress, 20000)
	b := read()
	for i, want := range []bool{fentry, enters, exits} {
		if []uint64{s.fentry, s.enters, s.exits}[i] == 0 {
			continue
		}
		if moved := b[i] > a[i]; moved != want {
			t.Fatalf("%s: %s %d->%d, want moving=%v", what, []string{"__fentry__ calls", "cyg enters", "cyg exits"}[i], a[i], b[i], want)
		}
	}
}

func (s *fentrySubject) run(t *testing.T, args ...string) cmdResult {
	t.Helper()
	return command(t, "hotpatch", append([]string{"--pid", fmt.Sprint(s.Pid)}, append(s.probeArgs, args...)...)...)
}

func TestFentryLive(t *testing.T) {
	testutil.RequirePtrace(t)
	for _, c := range []struct {
		spec    testutil.Spec
		useList bool
	}{
		{testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: testutil.Bool(true)}, true},                 // addr32 call (relaxed GOT call)
		{testutil.Spec{Compiler: "clang", Opt: "-O2", PIE: testutil.Bool(false)}, false},             // call rel32, by scan
		{testutil.Spec{Compiler: "gcc", Opt: "-O0", PIE: testutil.Bool(false)}, false},               // call rel32
		{testutil.Spec{Compiler: "gcc", Opt: "-O2", Static: true, PIE: testutil.Bool(false)}, true},  // addr32 call
		{testutil.Spec{Compiler: "clang", Opt: "-O2", PIE: testutil.Bool(true), NoPLT: true}, false}, // clang ignores -fno-plt for __fentry__
	} {
		name := c.spec.String()
		if c.useList {
			name += "-list"
		}
		t.Run(name, func(t *testing.T) {
			s := startFentry(t, c.spec, true, false, c.useList)
			s.expect(t, "cold", false, false, false)
			before := s.states(t)
			for _, st := range before {
				if st.Provider != probelist.ProviderFentry || st.Kind != probelist.KindEntry || st.State != "off" {
					t.Errorf("probe %d (%s %s %s) is %s", st.ID, st.Provider, st.Kind, st.Function, st.State)
				}
			}

			// An fentry function's exits come from the runtime, not a site.
			r := s.run(t, "--enable", "work", "--kind", "exit")
			if r.Code != 1 || !strings.Contains(r.Stderr, "fentry") || !strings.Contains(r.Stderr, "EDGEPROBE_FENTRY_EXITS=1") {
				t.Errorf("--kind exit on an fentry probe: exit %d, stderr %q", r.Code, r.Stderr)
			}
			// and no cyg probe is there to select
			if r := s.run(t, "--enable", "work", "--provider", "cyg"); r.Code != 3 {
				t.Errorf("--provider cyg on an fentry-only program: exit %d, stderr %q; want 3 (no match)", r.Code, r.Stderr)
			}
			if r := s.run(t, "--enable", "work", "--provider", "xray"); r.Code != 2 {
				t.Errorf("--provider xray: exit %d, want 2 (usage)", r.Code)
			}
			s.expect(t, "after the refused requests", false, false, false)

			s.hotpatch(t, "--enable", "work", "--kind", "entry")
			s.expect(t, "work's fentry probe on", true, false, false)
			s.hotpatch(t, "--disable", "work")
			s.expect(t, "work off", false, false, false)
			s.hotpatch(t, "--enable", "leaf", "--provider", "fentry") // kind both: the entry site
			s.expect(t, "leaf on", true, false, false)
			for _, st := range s.states(t) {
				if (st.State == "on") != (st.Function == "leaf") {
					t.Errorf("probe %d (%s %s) is %s", st.ID, st.Kind, st.Function, st.State)
				}
			}
			s.hotpatch(t, "--enable", "*")
			s.expect(t, "everything on", true, false, false)
			s.hotpatch(t, "--disable", "*", "--provider", "all")
			s.expect(t, "everything off", false, false, false)
			s.finish(t)
		})
	}
}

// TestFentryGlibc: with glibc's __fentry__ (gmon's, a no-op unless
// profiling was started) the sites toggle and the program stays correct;
// gcc reaches it through the GOT in a PIE. Enabling loads the runtime,
// which then takes the GOT slot (docs/injection.md).
func TestFentryGlibc(t *testing.T) {
	testutil.RequirePtrace(t)
	t.Setenv(EnvRuntime, testutil.Runtime(t, "gcc"))
	s := startFentry(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: testutil.Bool(true)}, false, false, false)
	for _, p := range []string{"--enable", "--disable"} {
		s.hotpatch(t, p, "*")
		s.AwaitProgress(s.progress, 20000)
		for _, st := range s.states(t) {
			if want := map[string]string{"--enable": "on", "--disable": "off"}[p]; st.State != want {
				t.Errorf("after %s: probe %d (%s) is %s", p, st.ID, st.Function, st.State)
			}
		}
	}
	s.finish(t)
}

// TestBothProvidersLive: built -finstrument-functions -pg -mfentry, each
// function has an fentry site and cyg sites, selected apart by --provider.
func TestBothProvidersLive(t *testing.T) {
	testutil.RequirePtrace(t)
	s := startFentry(t, testutil.Spec{Compiler: "gcc", Opt: "-O2", PIE: testutil.Bool(true)}, true, true, false)
	s.expect(t, "cold", false, false, false)
	s.hotpatch(t, "--enable", "work", "--provider", "fentry")
	s.expect(t, "work's fentry probe", true, false, false)
	s.hotpatch(t, "--disable", "work", "--provider", "fentry")
	s.hotpatch(t, "--enable", "work", "--provider", "cyg")
	s.expect(t, "work's cyg probes", false, true, true)
	// exits only: the cyg exit site, once fentry is excluded
	if r := s.run(t, "--enable", "leaf", "--kind", "exit"); r.Code != 1 || !strings.Contains(r.Stderr, "provider cyg") {
		t.Errorf("--kind exit naming fentry probes: exit %d, stderr %q", r.Code, r.Stderr)
	}
	s.hotpatch(t, "--disable", "*")
	s.hotpatch(t, "--enable", "leaf", "--kind", "exit", "--provider", "cyg")
	s.expect(t, "leaf's cyg exit", false, false, true)
	s.hotpatch(t, "--enable", "*")
	s.expect(t, "everything", true, true, true)
	counts := map[string]int{}
	for _, st := range s.states(t) {
		if strings.Contains(st.Object, "mt-") && st.State == "on" {
			counts[st.Provider]++
		}
	}
	if counts[probelist.ProviderCyg] == 0 || counts[probelist.ProviderFentry] == 0 {
		t.Errorf("probes on by provider: %v", counts)
	}
	s.hotpatch(t, "--disable", "*")
	s.expect(t, "nothing", false, false, false)
	s.finish(t)
}
