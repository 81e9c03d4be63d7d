package hotpatch

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestVerifiedListCache: a `--disable '*'` of a whole list records in the
// probe cache that the list agreed with the scan, so the next whole-list
// call checks nothing again (its -v statistics show three hits: list, scan,
// record); a list then hand-edited (one probe's hook renamed: its bytes
// still pass the live-bytes check, only the scan check can refuse it) is
// refused with nothing written, the record of the old list notwithstanding;
// and a record another user owns is not used.
func TestVerifiedListCache(t *testing.T) {
	testutil.RequirePtrace(t)
	cache := filepath.Join(t.TempDir(), "cache")
	t.Setenv("EDGEPROBE_CACHE", cache)
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"jitpage.c", "hooks.c"}, Flags: []string{"-fno-toplevel-reorder"}})
	good, _, err := elfscan.Scan(fx.Path, elfscan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	if len(good.Probes) < verifyCacheMin {
		t.Fatalf("%d probes: the fixture is too small for the verification cache (%d)", len(good.Probes), verifyCacheMin)
	}
	list := filepath.Join(t.TempDir(), "probes.json")
	if err := good.WriteFile(list); err != nil {
		t.Fatal(err)
	}
	p := testutil.Start(t, nil, fx.Path, "plain")
	pid := fmt.Sprint(p.Pid)
	stats := func(r cmdResult) string {
		t.Helper()
		prefix := "probe cache " + cache + ": "
		i := strings.Index(r.Stderr, prefix)
		if i < 0 {
			t.Fatalf("no cache statistics in stderr:\n%s", r.Stderr)
		}
		line, _, _ := strings.Cut(r.Stderr[i+len(prefix):], "\n")
		return line
	}
	r := hotpatchOK(t, "-v", "--pid", pid, "--probes", list, "--disable", "*")
	if s := stats(r); !strings.HasPrefix(s, "0 hits, 3 misses") {
		t.Fatalf("first call: %q, want 0 hits and 3 misses (list, scan, record)", s)
	}
	// The record: an entry of its kind (probecache.kindVerified, 3). Its
	// key holds hotpatch's own build identity, so this test's Cache could
	// not look it up; the next call's statistics show it used.
	records := func() []string {
		var out []string
		ents, _ := os.ReadDir(cache)
		for _, e := range ents {
			data, err := os.ReadFile(filepath.Join(cache, e.Name()))
			if err == nil && len(data) > 8 && string(data[:8]) == "EPCACHE2" && data[8] == 3 {
				out = append(out, filepath.Join(cache, e.Name()))
			}
		}
		return out
	}
	if n := len(records()); n != 1 {
		t.Fatalf("%d verification records after a whole-list call, want 1", n)
	}
	targets, err := LoadTargets(p.Pid, []string{list})
	if err != nil {
		t.Fatal(err)
	}
	tg := targets[0]
	r = hotpatchOK(t, "-v", "--pid", pid, "--probes", list, "--enable", "*")
	if s := stats(r); !strings.HasPrefix(s, "3 hits, 0 misses") {
		t.Fatalf("second call: %q, want 3 hits (list, scan, record)", s)
	}
	hotpatchOK(t, "--pid", pid, "--probes", list, "--disable", "*")

	// Every site is off now. The same list with one entry probe's hook
	// renamed, as long as before, in the same file.
	live := func() []byte {
		var all []byte
		for _, q := range good.Probes {
			all = append(all, readLive(t, p.Pid, tg.Object.Runtime(uint64(q.Address)), len(q.Active))...)
		}
		return all
	}
	b, err := os.ReadFile(list)
	if err != nil {
		t.Fatal(err)
	}
	// As long as before: the value one letter shorter, a space after it.
	edited := bytes.Replace(b, []byte(`"hook": "__cyg_profile_func_enter"`), []byte(`"hook": "__cyg_profile_func_exit" `), 1)
	if bytes.Equal(edited, b) || len(edited) != len(b) {
		t.Fatal("no entry probe to edit")
	}
	if _, err := probelist.Read(bytes.NewReader(edited)); err != nil {
		t.Fatalf("the edited list does not parse: %v", err)
	}
	if err := os.WriteFile(list, edited, 0o644); err != nil {
		t.Fatal(err)
	}
	before := live()
	r = command(t, "hotpatch", "--pid", pid, "--probes", list, "--enable", "*")
	if r.Code != 1 || !strings.Contains(r.Stderr, "nothing was written") || !strings.Contains(r.Stderr, "__cyg_profile_func_exit") {
		t.Fatalf("hand-edited list: exit %d, stderr %q; want exit 1 refusing the renamed hook", r.Code, r.Stderr)
	}
	if after := live(); !bytes.Equal(before, after) {
		t.Fatal("a site changed under a refused list")
	}

	// The good list again; its record now owned by another user.
	if err := os.WriteFile(list, b, 0o644); err != nil {
		t.Fatal(err)
	}
	t.Run("record of another user", func(t *testing.T) {
		o := testutil.OtherUser(t)
		recs := records()
		if len(recs) != 1 {
			t.Fatalf("%d verification records in the cache, want 1", len(recs))
		}
		if err := os.Chown(recs[0], int(o.UID), int(o.GID)); err != nil {
			t.Fatal(err)
		}
		// The list's file was rewritten (read again), the scan is cached,
		// the record is not used: checked again, and recorded anew.
		r = hotpatchOK(t, "-v", "--pid", pid, "--probes", list, "--disable", "*")
		if s := stats(r); !strings.HasPrefix(s, "1 hits, 2 misses") {
			t.Fatalf("record owned by another user: %q, want the scan from the cache, the list and the record missed", s)
		}
		r = hotpatchOK(t, "-v", "--pid", pid, "--probes", list, "--enable", "*")
		if s := stats(r); !strings.HasPrefix(s, "3 hits, 0 misses") {
			t.Fatalf("after the record was made anew: %q, want 3 hits", s)
		}
	})
	p.Finish()
}
