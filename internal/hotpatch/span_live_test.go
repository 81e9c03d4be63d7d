package hotpatch

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestSpanWrites: a flip batch over a real program's 800 probes is written
// as checked spans, and one beside a thread that rewrites its own text (a
// JIT-like area sharing a page with probe sites, made writable with
// mprotect for each store) leaves that page to one-byte writes: the writer
// never finds its byte undone, the workers never compute a wrong result,
// and every site ends in the asked state.
func TestSpanWrites(t *testing.T) {
	testutil.RequirePtrace(t)
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"jitpage.c"}, Flags: []string{"-fno-toplevel-reorder"}})
	for _, mode := range []string{"plain", "jit"} {
		t.Run(mode, func(t *testing.T) {
			p := testutil.Start(t, nil, fx.Path, mode)
			progress := p.Symbol(fx.Path, "progress")
			for round := 0; round < 6; round++ {
				verb, want := "--disable", "off"
				if round%2 == 1 {
					verb, want = "--enable", "on"
				}
				r := hotpatchOK(t, "--pid", fmt.Sprint(p.Pid), verb, "f*", "--json")
				var res Result
				if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
					t.Fatalf("--json: %v\n%s", err, r.Stdout)
				}
				if !res.OK || len(res.Sites) != 800 || res.Changed != 800 {
					t.Fatalf("round %d: ok=%v, %d sites, %d changed; want 800 changed", round, res.OK, len(res.Sites), res.Changed)
				}
				for _, s := range res.Sites {
					if s.After != want || s.Before == want {
						t.Fatalf("round %d: site %s %s: %s -> %s, want -> %s", round, s.Function, s.Kind, s.Before, s.After, want)
					}
				}
				sp := res.Spans
				if sp == nil || len(sp.Raced) != 0 || sp.SpanSites+sp.OneByte != res.Changed {
					t.Fatalf("round %d: spans %+v for %d changed sites", round, sp, res.Changed)
				}
				switch mode {
				case "plain":
					if sp.Spans == 0 || sp.OneByte != 0 || len(sp.Fallbacks) != 0 || len(res.Warnings) != 0 {
						t.Fatalf("round %d: untouched text not written as spans: %+v, warnings %q", round, sp, res.Warnings)
					}
				case "jit":
					// The JIT page's sites: one byte each, whether the page
					// was writable when the maps were read (not r-x) or not
					// (its bytes differ from the file).
					if sp.Spans == 0 || sp.OneByte == 0 {
						t.Fatalf("round %d: the writer's page was not left to one-byte writes: %+v", round, sp)
					}
					for _, f := range sp.Fallbacks {
						if !strings.Contains(f, "differs from the file") {
							t.Fatalf("round %d: unexpected fallback %q", round, f)
						}
					}
				}
				p.AwaitProgress(progress, 3) // every function ran in its new form
			}
			out, _ := p.Finish()
			if !strings.Contains(out, "wrong=0 reverted=0") || (mode == "jit" && strings.Contains(out, "writes=0")) {
				t.Fatalf("the program saw a wrong result or an undone store: %q", out)
			}
			t.Logf("%s: %s", mode, strings.TrimSpace(out))
		})
	}
}
