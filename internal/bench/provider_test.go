package bench

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestProviderRow builds every variant of the provider-cost row's workloads
// in the tiny configuration. The row itself fails when a variant's output
// differs from the uninstrumented build's, when a cold build reaches a hook
// under the counting preload, or when the runtime's counts disagree with
// the preload's; this test checks the same from the results, and that the
// row's JSON keys have a value or a reason.
func TestProviderRow(t *testing.T) {
	h := harness(t, "provider")
	if why := h.Rep.Skipped["provider_cost.cyg_flip"]; strings.Contains(why, "binutils-source not installed") {
		testutil.Unavailable(t, "%s", why)
	}
	var keys []string
	for _, k := range ProviderKeys {
		keys = append(keys, "provider_cost."+k, "provider_cost.zlib."+k, "provider_cost.demangle."+k)
	}
	requireKeys(t, h, keys...)
	seen := map[string]bool{}
	for _, r := range h.Rep.Provider {
		seen[r.Workload+"."+r.Variant] = true
		if r.Skip != "" {
			if !strings.HasPrefix(r.Variant, "fentry_runtime") {
				t.Errorf("%s %s not measured: %s", r.Workload, r.Variant, r.Skip)
			}
			continue
		}
		if !r.SameOutput {
			t.Errorf("%s %s: output differs from the uninstrumented build's", r.Workload, r.Variant)
		}
		if r.CPU.N != h.Cfg.ProviderPairs {
			t.Errorf("%s %s: %d timed runs, want %d", r.Workload, r.Variant, r.CPU.N, h.Cfg.ProviderPairs)
		}
		if r.Cold && r.HookCalls != 0 {
			t.Errorf("%s %s: cold build reached %d hooks", r.Workload, r.Variant, r.HookCalls)
		}
		if !r.Cold && r.Variant != "uninstrumented" && r.Variant != "runtime_startup" && r.HookCalls == 0 {
			t.Errorf("%s %s: active build reached no hook", r.Workload, r.Variant)
		}
	}
	for _, w := range []string{"zlib", "demangle"} {
		for _, k := range append([]string{"uninstrumented"}, ProviderKeys...) {
			if !seen[w+"."+k] {
				t.Errorf("no result for %s %s", w, k)
			}
		}
	}
}

// TestProviderRowMissingSource: without binutils-source the row reports
// every key as not measured, with the reason, and does not fail.
func TestProviderRowMissingSource(t *testing.T) {
	old := binutilsTarball
	binutilsTarball = "/nonexistent/binutils-2.40.tar.xz"
	defer func() { binutilsTarball = old }()
	h := &Harness{Cfg: Tiny(), Rep: newReport(Tiny(), TSC{Hz: 1e9})}
	if err := h.RunProvider(context.Background()); err != nil {
		t.Fatal(err)
	}
	for _, k := range ProviderKeys {
		if why := h.Rep.Skipped["provider_cost."+k]; !strings.HasPrefix(why, "not measured: binutils-source not installed") {
			t.Errorf("provider_cost.%s: reason %q", k, why)
		}
	}
	if len(h.Rep.Sections) != 1 || !strings.Contains(h.Rep.Sections[0].Text, "binutils-source not installed") {
		t.Errorf("the section does not say why: %+v", h.Rep.Sections)
	}
}

func TestRuntimeSources(t *testing.T) {
	if srcs := runtimeSources(t.TempDir()); len(srcs) != 0 {
		t.Errorf("runtimeSources(empty dir) = %v, want none", srcs)
	}
	// The repository's runtime: every .c and .S file, the same list the
	// tests build from (testutil.RuntimeFiles) and the Makefile compiles.
	root := testutil.RepoRoot(t)
	want, _ := testutil.RuntimeFiles(t)
	var got []string
	for _, s := range runtimeSources(root) {
		if !strings.HasPrefix(s, "runtime/") {
			t.Errorf("runtimeSources: %q is not under runtime/", s)
		}
		got = append(got, strings.TrimPrefix(s, "runtime/"))
	}
	sort.Strings(got)
	if strings.Join(got, " ") != strings.Join(want, " ") {
		t.Errorf("runtimeSources(repo) = %v, want %v", got, want)
	}
}

// TestReadmeFigures: the README's figures block exists once, and a report
// fills it (every figure from the run; a missing one refuses to write).
func TestReadmeFigures(t *testing.T) {
	root, err := FindRoot(".")
	if err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile(filepath.Join(root, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	r := &Report{Values: map[string]any{}}
	if _, err := ReadmeFigures(r); err == nil {
		t.Fatal("figures from an empty report")
	}
	for i, k := range readmeKeys {
		r.Values[k] = float64(i + 1)
	}
	r.Values["batch20k.probes"] = float64(40000)
	fig, err := ReadmeFigures(r)
	if err != nil {
		t.Fatal(err)
	}
	out, err := ReplaceReadmeFigures(string(readme), fig)
	if err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(out, "1.0 ns per hook counting, 2.0 ns counting and timing (glibc's empty hook: 3.0 ns)") ||
		!strings.Contains(out, "40,000-probe batch") || strings.Count(out, ReadmeBegin) != 1 {
		t.Errorf("figures block not filled as expected:\n%s", out)
	}
	if again, err := ReplaceReadmeFigures(out, fig); err != nil || again != out {
		t.Errorf("replacing twice changed the README (err %v)", err)
	}
	if _, err := ReplaceReadmeFigures("no markers", fig); !errors.Is(err, ErrReadmeMarkers) {
		t.Errorf("no markers: %v", err)
	}
}
