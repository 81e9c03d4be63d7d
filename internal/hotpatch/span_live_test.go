package hotpatch

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// TestSpanWrites: a flip batch over a real program's 800 probes is written
// as checked spans, and one beside a thread that rewrites its own text (a
// JIT-like area sharing a page with probe sites, made writable with
// mprotect for each store) leaves that page to one-byte writes: the writer
// never finds its byte undone, the workers never compute a wrong result,
// and every site ends in the asked state. Each batch is one hotpatch call,
// or (the -session modes) one Apply of a session that keeps its
// selections' span images (D61) from their second flip on.
//
// The program links counting hooks (hooks.c), so enabling loads no runtime.
func TestSpanWrites(t *testing.T) {
	testutil.RequirePtrace(t)
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"jitpage.c", "hooks.c"}, Flags: []string{"-fno-toplevel-reorder"}})
	for _, mode := range []string{"plain", "jit", "plain-session", "jit-session"} {
		t.Run(mode, func(t *testing.T) {
			writer, session := strings.CutSuffix(mode, "-session")
			p := testutil.Start(t, nil, fx.Path, writer)
			progress := p.Symbol(fx.Path, "progress")
			var ses *Session
			if session {
				var err error
				if ses, err = Open(p.Pid, nil, false); err != nil {
					t.Fatal(err)
				}
				defer ses.Close()
			}
			sel, err := probelist.ParseSelector("f*", "")
			if err != nil {
				t.Fatal(err)
			}
			// 6 rounds; under EDGEPROBE_SOAK, as many as fit in it.
			end := time.Now()
			if v := os.Getenv("EDGEPROBE_SOAK"); v != "" {
				d, err := time.ParseDuration(v)
				if err != nil {
					t.Fatalf("EDGEPROBE_SOAK=%q: %v", v, err)
				}
				end = end.Add(d)
			}
			rounds := 0
			for round := 0; round < 6 || time.Now().Before(end); round++ {
				rounds++
				verb, want := "--disable", "off"
				if round%2 == 1 {
					verb, want = "--enable", "on"
				}
				var res Result
				if session {
					r, err := ses.Apply(context.Background(), []Action{{Enable: want == "on", Selector: sel}}, ProtoAuto, 0)
					if err != nil {
						t.Fatalf("round %d: %v", round, err)
					}
					res = *r
				} else {
					r := hotpatchOK(t, "--pid", fmt.Sprint(p.Pid), verb, "f*", "--json")
					if err := json.Unmarshal([]byte(r.Stdout), &res); err != nil {
						t.Fatalf("--json: %v\n%s", err, r.Stdout)
					}
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
				switch writer {
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
			if session {
				// From the second flip of each selection on, the spans
				// were written from their images.
				images := 0
				for _, q := range ses.prepared {
					images += q.batch.ImageBytes()
				}
				if images == 0 {
					t.Fatal("the session kept no span images")
				}
				if err := ses.Close(); err != nil {
					t.Fatal(err)
				}
			}
			out, _ := p.Finish()
			if !strings.Contains(out, "wrong=0 reverted=0") || (writer == "jit" && strings.Contains(out, "writes=0")) {
				t.Fatalf("the program saw a wrong result or an undone store: %q", out)
			}
			t.Logf("%s, %d batches: %s", mode, rounds, strings.TrimSpace(out))
		})
	}
}

// TestSpanHazardUnchecked is the control for TestSpanWrites (an opt-in
// soak, EDGEPROBE_SOAK): the same program and writer, batches written as
// spans without the pristine check and read-back (xmod's plain Coalesce
// option), until the writer finds one of its stores undone. It passes when
// that happens within the soak: the hazard the checks exist for is real.
func TestSpanHazardUnchecked(t *testing.T) {
	d, err := time.ParseDuration(testutil.OptIn(t, "EDGEPROBE_SOAK", "unchecked span-write hazard"))
	if err != nil {
		t.Fatal(err)
	}
	testutil.RequirePtrace(t)
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"jitpage.c", "hooks.c"}, Flags: []string{"-fno-toplevel-reorder"}})
	p := testutil.Start(t, nil, fx.Path, "jit")
	reverted := p.Symbol(fx.Path, "reverted")
	targets, err := LoadTargets(p.Pid, nil)
	if err != nil {
		t.Fatal(err)
	}
	var sites []xmod.Site
	for _, tg := range targets {
		if !strings.Contains(tg.Object.Path, "jitpage") {
			continue
		}
		for i := 0; i < tg.List.Len(); i++ {
			pr, err := tg.Probe(i)
			if err != nil {
				t.Fatal(err)
			}
			sites = append(sites, xmod.Site{Addr: tg.Object.Runtime(uint64(pr.Address)), Active: pr.Active, Inert: pr.Inert})
		}
	}
	mem, err := ptrace.OpenMem(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	defer mem.Close()
	batches := 0
	for end := time.Now().Add(d); time.Now().Before(end) && p.Read64(reverted) == 0; batches++ {
		cs := make([]xmod.Change, len(sites))
		for i, s := range sites {
			cs[i] = xmod.Change{Site: s, On: batches%2 == 0}
		}
		if _, err := xmod.Flip(context.Background(), mem, cs, xmod.FlipOptions{Coalesce: true}); err != nil {
			t.Fatal(err)
		}
	}
	n := p.Read64(reverted)
	out, _ := p.Finish()
	t.Logf("%d unchecked span batches of %d sites: %s", batches, len(sites), strings.TrimSpace(out))
	if n == 0 {
		t.Fatalf("no store of the writer was undone in %d unchecked batches (%v): the control did not reproduce the hazard", batches, d)
	}
}

// TestSpanImagesLive: a session toggling a selection back and forth writes
// its spans from their images (D61) until a byte of the text outside any
// probe site changes between two batches (a writer's first store into an
// untouched page, made here through the session's tracer): the next batch
// checks that span against the file again, leaves it to one-byte writes
// and the store in place, and every site still ends in the asked state.
func TestSpanImagesLive(t *testing.T) {
	testutil.RequirePtrace(t)
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"jitpage.c", "hooks.c"}, Flags: []string{"-fno-toplevel-reorder"}})
	p := testutil.Start(t, nil, fx.Path, "plain")
	area := p.Symbol(fx.Path, "jit_area") // 64 bytes of int3 between f299 and f300, never run
	ses, err := Open(p.Pid, nil, false)
	if err != nil {
		t.Fatal(err)
	}
	defer ses.Close()
	sel, err := probelist.ParseSelector("f*", "")
	if err != nil {
		t.Fatal(err)
	}
	apply := func(on bool) *Result {
		t.Helper()
		r, err := ses.Apply(context.Background(), []Action{{Enable: on, Selector: sel}}, ProtoAuto, 0)
		if err != nil {
			t.Fatalf("apply %v: %v", on, err)
		}
		if !r.OK || r.Changed != 800 || r.Spans == nil || len(r.Spans.Raced) != 0 {
			t.Fatalf("apply %v: ok=%v, %d changed, spans %+v", on, r.OK, r.Changed, r.Spans)
		}
		return r
	}
	images := func() int {
		n := 0
		for _, q := range ses.prepared {
			n += q.batch.ImageBytes()
		}
		return n
	}
	for i := 0; i < 3; i++ { // the probes start on; the second of each makes the images
		apply(false)
		apply(true)
	}
	if images() == 0 {
		t.Fatal("no images after three rounds")
	}
	// DropImagesOf drops one selection's images and no other's: a second
	// selection (f2*, inside the first's spans) made to keep images, then
	// dropped, writes its spans checked in full while the first still
	// writes from its images (SpanStats.Imaged).
	sel2, err := probelist.ParseSelector("f2*", "")
	if err != nil {
		t.Fatal(err)
	}
	apply2 := func(on bool) *Result {
		t.Helper()
		r, err := ses.Apply(context.Background(), []Action{{Enable: on, Selector: sel2}}, ProtoAuto, 0)
		if err != nil || !r.OK || r.Spans == nil || r.Spans.Spans == 0 {
			t.Fatalf("apply f2* %v: %v %+v", on, err, r)
		}
		return r
	}
	for i := 0; i < 3; i++ { // the probes are on: each selection ends as it found them
		apply2(false)
		if r := apply2(true); i == 2 && r.Spans.Imaged != r.Spans.Spans {
			t.Fatalf("f2*'s third round: %d of %d spans from images", r.Spans.Imaged, r.Spans.Spans)
		}
	}
	for _, on := range []bool{false, true} {
		ses.DropImagesOf([]Action{{Enable: on, Selector: sel2}}, "")
	}
	for _, on := range []bool{false, true} {
		if r := apply(on); r.Spans.Imaged != r.Spans.Spans {
			t.Fatalf("f*, %v, after f2*'s images were dropped: %d of %d spans from images", on, r.Spans.Imaged, r.Spans.Spans)
		}
	}
	for _, on := range []bool{false, true} {
		if r := apply2(on); r.Spans.Imaged != 0 {
			t.Fatalf("f2*, %v, after its images were dropped: %d of %d spans from images", on, r.Spans.Imaged, r.Spans.Spans)
		}
	}
	read := func() byte {
		b := make([]byte, 1)
		if err := ses.tracer.ReadMem(area+10, b); err != nil {
			t.Fatal(err)
		}
		return b[0]
	}
	if err := ses.tracer.WriteMem(area+10, []byte{0x90}); err != nil {
		t.Fatal(err)
	}
	r := apply(false)
	if len(r.Spans.Fallbacks) == 0 || r.Spans.OneByte == 0 {
		t.Fatalf("the span over a changed byte was written from its image: %+v", r.Spans)
	}
	for _, f := range r.Spans.Fallbacks {
		if !strings.Contains(f, "differs from the file") {
			t.Fatalf("unexpected fallback %q", f)
		}
	}
	if b := read(); b != 0x90 {
		t.Fatalf("the foreign store was undone: %#x", b)
	}
	apply(true)
	// Put back: the spans are checked against the file again, pass, and
	// are written whole.
	if err := ses.tracer.WriteMem(area+10, []byte{0xcc}); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if r := apply(false); len(r.Spans.Fallbacks) != 0 || r.Spans.OneByte != 0 {
			t.Fatalf("round %d after the byte was put back: %+v", i, r.Spans)
		}
		apply(true)
	}
	if err := ses.Close(); err != nil {
		t.Fatal(err)
	}
	out, _ := p.Finish()
	if !strings.Contains(out, "wrong=0 reverted=0") {
		t.Fatalf("the program saw a wrong result: %q", out)
	}
}
