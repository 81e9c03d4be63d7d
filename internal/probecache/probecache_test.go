package probecache

import (
	"bytes"
	"crypto/sha256"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"reflect"
	"strings"
	"testing"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

func openCache(t *testing.T) *Cache {
	t.Helper()
	c, err := Open(filepath.Join(t.TempDir(), "cache"))
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// later makes the cache's clock run ahead, so files made by the test are
// old enough for clean (non-racy) entries.
func later(c *Cache) { c.now = func() time.Time { return time.Now().Add(time.Hour) } }

// probeList builds a fixture, scans it and writes its probe list as JSON.
func probeList(t *testing.T) (string, *probelist.List) {
	t.Helper()
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"basic.c"}})
	l, _, err := elfscan.Scan(fx.Path, elfscan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(t.TempDir(), "probes.json")
	if err := l.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	return path, l
}

func mustList(t *testing.T, c *Cache, path string, want *probelist.List) {
	t.Helper()
	x, err := c.List(path)
	if err != nil {
		t.Fatal(err)
	}
	got, err := x.List()
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(got, want) {
		t.Fatalf("the cached list differs from the JSON")
	}
}

func expectStats(t *testing.T, c *Cache, hits, misses int64) {
	t.Helper()
	if h, m := c.Stats(); h != hits || m != misses {
		t.Fatalf("%d hits and %d misses, want %d and %d", h, m, hits, misses)
	}
}

func entryPath(t *testing.T, c *Cache) string {
	t.Helper()
	m, _ := filepath.Glob(filepath.Join(c.Path(), "*.epc"))
	if len(m) != 1 {
		t.Fatalf("%d entries, want 1: %v", len(m), m)
	}
	return m[0]
}

func TestListCached(t *testing.T) {
	path, want := probeList(t)
	c := openCache(t)
	later(c)
	mustList(t, c, path, want)
	expectStats(t, c, 0, 1)
	mustList(t, c, path, want)
	expectStats(t, c, 1, 1)
	// A clean entry is trusted on the file's identity alone: a changed hash
	// in it does not matter ...
	changeHash(t, entryPath(t, c))
	mustList(t, c, path, want)
	expectStats(t, c, 2, 1)
	// ... but a change of the file does, whatever its size.
	l := *want
	l.Binary.Path = "/elsewhere/" + strings.Repeat("x", 4)
	if err := l.WriteFile(path); err != nil {
		t.Fatal(err)
	}
	mustList(t, c, path, &l)
	expectStats(t, c, 2, 2)
}

// TestListRacy: an entry made right after the file changed is used only
// after its content is hashed again; a different content is a miss.
func TestListRacy(t *testing.T) {
	path, want := probeList(t)
	c := openCache(t)
	mustList(t, c, path, want) // the file is new: a racy entry
	mustList(t, c, path, want)
	expectStats(t, c, 1, 1)
	changeHash(t, entryPath(t, c)) // as if the file had changed within its ctime's tick
	mustList(t, c, path, want)
	expectStats(t, c, 1, 2)
	// Once the file is old enough, the entry is rewritten clean.
	later(c)
	mustList(t, c, path, want)
	expectStats(t, c, 2, 2)
	changeHash(t, entryPath(t, c))
	mustList(t, c, path, want)
	expectStats(t, c, 3, 2)
}

// changeHash alters the content hash an entry records, with a fitting CRC.
func changeHash(t *testing.T, e string) {
	t.Helper()
	b, err := os.ReadFile(e)
	if err != nil {
		t.Fatal(err)
	}
	b[100] ^= 0xff
	binary.LittleEndian.PutUint32(b[136:], entryCRC(b))
	if err := os.WriteFile(e, b, 0o600); err != nil {
		t.Fatal(err)
	}
}

// TestRejectedEntries: a corrupt, foreign, shared or linked entry is
// ignored and replaced, and what it pointed at is left alone.
func TestRejectedEntries(t *testing.T) {
	path, want := probeList(t)
	cases := map[string]func(t *testing.T, e string){
		"corrupt header": func(t *testing.T, e string) {
			b, _ := os.ReadFile(e)
			b[60] ^= 0xff // the file's inode as recorded, the CRC left as it was
			os.WriteFile(e, b, 0o600)
		},
		"corrupt name index": func(t *testing.T, e string) {
			b, _ := os.ReadFile(e)
			le := binary.LittleEndian
			indexOff := entryHeaderSize + int(le.Uint32(b[entryHeaderSize+20:]))
			b[indexOff] ^= 0x01 // the compact form's header checksum covers it
			os.WriteFile(e, b, 0o600)
		},
		"truncated": func(t *testing.T, e string) { os.Truncate(e, 100) },
		"other writable": func(t *testing.T, e string) {
			os.Chmod(e, 0o666)
		},
		"symlink": func(t *testing.T, e string) {
			victim := filepath.Join(t.TempDir(), "victim")
			b, _ := os.ReadFile(e)
			os.WriteFile(victim, b, 0o600)
			os.Remove(e)
			os.Symlink(victim, e)
			t.Cleanup(func() {
				if got, _ := os.ReadFile(victim); string(got) != string(b) {
					t.Error("the symlink's target was written")
				}
			})
		},
		"foreign owner": func(t *testing.T, e string) {
			testutil.RequireRoot(t, "to give an entry to another user")
			os.Chown(e, 65534, 65534)
		},
	}
	for name, spoil := range cases {
		t.Run(name, func(t *testing.T) {
			c := openCache(t)
			later(c)
			mustList(t, c, path, want)
			spoil(t, entryPath(t, c))
			mustList(t, c, path, want) // ignored: a miss, and rebuilt
			expectStats(t, c, 0, 2)
			st, err := os.Lstat(entryPath(t, c))
			if err != nil || !st.Mode().IsRegular() || st.Mode().Perm() != 0o600 {
				t.Fatalf("rebuilt entry: %v %v", st.Mode(), err)
			}
			mustList(t, c, path, want)
			expectStats(t, c, 1, 2)
		})
	}
}

// TestCorruptRecord: an entry's records are checked when decoded, not
// when it is looked up (D67). One corrupt byte in a record, or in the
// strings of one, is refused when that probe is decoded, with an error that
// names the entry; nothing of the probe is used; the entry is removed, so
// the next call is a miss that rebuilds it from the JSON.
func TestCorruptRecord(t *testing.T) {
	path, want := probeList(t)
	le := binary.LittleEndian
	spoil := map[string]func(b []byte) int{ // returns the probe spoiled
		"record": func(b []byte) int {
			k := len(want.Probes) / 2
			b[entryHeaderSize+80+72*k+50] ^= 0x01 // its active bytes
			return k
		},
		"string": func(b []byte) int {
			strOff := entryHeaderSize + int(le.Uint32(b[entryHeaderSize+24:]))
			k := len(want.Probes) - 1
			rec := b[entryHeaderSize+80+72*k:]
			fn := strOff + int(le.Uint32(rec[24:])) // its function's name
			b[fn] ^= 0x01
			return k
		},
	}
	for name, f := range spoil {
		t.Run(name, func(t *testing.T) {
			c := openCache(t)
			later(c)
			mustList(t, c, path, want)
			e := entryPath(t, c)
			b, err := os.ReadFile(e)
			if err != nil {
				t.Fatal(err)
			}
			k := f(b)
			if err := os.WriteFile(e, b, 0o600); err != nil {
				t.Fatal(err)
			}
			x, err := c.List(path)
			if err != nil {
				t.Fatalf("the lookup checks the entry's header only: %v", err)
			}
			expectStats(t, c, 1, 1)
			if k > 0 {
				if _, err := x.Probe(0); err != nil {
					t.Fatalf("an intact probe of the spoiled entry: %v", err)
				}
			}
			p, err := x.Probe(k)
			if !errors.Is(err, probelist.ErrCompact) || p != nil || !strings.Contains(err.Error(), filepath.Base(e)) {
				t.Fatalf("the spoiled probe %d: %v, %v; want an ErrCompact naming %s and no probe", k, p, err, filepath.Base(e))
			}
			if _, err := os.Lstat(e); !errors.Is(err, os.ErrNotExist) {
				t.Fatalf("the spoiled entry is still there: %v", err)
			}
			mustList(t, c, path, want) // rebuilt from the JSON
			expectStats(t, c, 1, 2)
			mustList(t, c, path, want)
			expectStats(t, c, 2, 2)
		})
	}
}

// TestOpenRefuses: a directory another user could write, one owned by
// another user, or a symlink is not used.
func TestOpenRefuses(t *testing.T) {
	dir := t.TempDir()
	private := filepath.Join(dir, "private")
	c, err := Open(private)
	if err != nil {
		t.Fatal(err)
	}
	if st, _ := os.Stat(private); st.Mode().Perm() != 0o700 {
		t.Errorf("created with mode %v, want 0700", st.Mode())
	}
	_ = c
	shared := filepath.Join(dir, "shared")
	os.Mkdir(shared, 0o777)
	os.Chmod(shared, 0o777)
	link := filepath.Join(dir, "link")
	os.Symlink(private, link)
	for _, p := range []string{shared, link} {
		if _, err := Open(p); !errors.Is(err, ErrUnsafe) {
			t.Errorf("%s: %v, want ErrUnsafe", p, err)
		}
	}
	if os.Geteuid() == 0 {
		foreign := filepath.Join(dir, "foreign")
		os.Mkdir(foreign, 0o700)
		os.Chown(foreign, 65534, 65534)
		if _, err := Open(foreign); !errors.Is(err, ErrUnsafe) {
			t.Errorf("a directory of uid 65534: %v, want ErrUnsafe", err)
		}
	}
	if _, err := Open(""); !errors.Is(err, ErrDisabled) {
		t.Errorf("no path: %v, want ErrDisabled", err)
	}
}

func TestDefaultDir(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		euid int
		env  map[string]string
		want string
	}{
		{0, nil, SystemDir},
		{1000, map[string]string{"HOME": "/home/u"}, "/home/u/.cache/edgeprobe"},
		{1000, map[string]string{"HOME": "/home/u", "XDG_CACHE_HOME": "/c"}, "/c/edgeprobe"},
		{1000, map[string]string{"HOME": "/home/u", "XDG_CACHE_HOME": "rel"}, "/home/u/.cache/edgeprobe"},
		{1000, nil, ""},
		{0, map[string]string{EnvDir: "/x"}, "/x"},
		{0, map[string]string{EnvDir: "off"}, ""},
	} {
		if got := defaultDir(c.euid, env(c.env)); got != c.want {
			t.Errorf("euid %d %v: %q, want %q", c.euid, c.env, got, c.want)
		}
	}
}

// TestScanCached: the scan of a running program's objects, cached; glibc
// (which defines the hooks and calls none) is recognised without a scan and
// cached as having no sites.
func TestScanCached(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}})
	p := testutil.Start(t, nil, fx.Path)
	objs, err := procmaps.Objects(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	want, _, err := elfscan.Scan(fx.Path, elfscan.Options{})
	if err != nil {
		t.Fatal(err)
	}
	c := openCache(t)
	later(c)
	for round := 0; round < 2; round++ {
		found := 0
		for i := range objs {
			o := &objs[i]
			x, err := c.Scan(p.Pid, o)
			switch {
			case errors.Is(err, elfscan.ErrNoHookSites):
				if strings.Contains(o.Path, filepath.Base(fx.Path)) {
					t.Fatalf("%s: no sites", o.Path)
				}
			case err != nil:
				t.Fatal(err)
			default:
				found++
				got, err := x.List()
				if err != nil {
					t.Fatal(err)
				}
				if !reflect.DeepEqual(got.Probes, want.Probes) || got.Binary.BuildID != want.Binary.BuildID {
					t.Fatalf("%s: the scan differs from elfscan.Scan's", o.Path)
				}
			}
		}
		if found != 1 {
			t.Fatalf("round %d: %d objects with sites, want the executable only", round, found)
		}
	}
	expectStats(t, c, int64(len(objs)), int64(len(objs)))
}

// TestPrune: past the entry limit, the oldest entries go.
func TestPrune(t *testing.T) {
	defer func(n int) { maxEntries = n }(maxEntries)
	maxEntries = 3
	c := openCache(t)
	for i := 0; i < 6; i++ {
		p := filepath.Join(t.TempDir(), "probes.json")
		_, l := probeListOnce(t)
		l.WriteFile(p)
		if _, err := c.List(p); err != nil {
			t.Fatal(err)
		}
	}
	if m, _ := filepath.Glob(filepath.Join(c.Path(), "*.epc")); len(m) != 3 {
		t.Fatalf("%d entries, want 3", len(m))
	}
}

var onceList *probelist.List

func probeListOnce(t *testing.T) (string, *probelist.List) {
	if onceList == nil {
		_, onceList = probeList(t)
	}
	return "", onceList
}

// TestVerifiedRecords: a record of a list checked against a scan is found
// for those two digests only, and not at all once spoiled (corrupt,
// truncated, writable by others, a symlink, owned by another user).
func TestVerifiedRecords(t *testing.T) {
	list, scan := [32]byte{1, 2, 3}, [32]byte{4, 5, 6}
	other := [32]byte{1, 2, 4}
	c := openCache(t)
	if c.Verified(list, scan) {
		t.Fatal("a record before any was made")
	}
	c.SetVerified(list, scan)
	if !c.Verified(list, scan) {
		t.Fatal("no record after SetVerified")
	}
	if c.Verified(other, scan) || c.Verified(list, other) || c.Verified(scan, list) {
		t.Fatal("a record found for other digests")
	}
	var nilCache *Cache
	nilCache.SetVerified(list, scan)
	if nilCache.Verified(list, scan) {
		t.Fatal("a nil cache has a record")
	}
	cases := map[string]func(t *testing.T, e string){
		"corrupt": func(t *testing.T, e string) {
			b, _ := os.ReadFile(e)
			b[len(b)-3] ^= 0xff
			os.WriteFile(e, b, 0o600)
		},
		"digest changed, checksum fixed": func(t *testing.T, e string) {
			b, _ := os.ReadFile(e)
			b[len(b)-1] ^= 0xff
			binary.LittleEndian.PutUint32(b[136:], entryCRC(b))
			os.WriteFile(e, b, 0o600)
		},
		"truncated":      func(t *testing.T, e string) { os.Truncate(e, 100) },
		"other writable": func(t *testing.T, e string) { os.Chmod(e, 0o666) },
		"symlink": func(t *testing.T, e string) {
			victim := filepath.Join(t.TempDir(), "victim")
			b, _ := os.ReadFile(e)
			os.WriteFile(victim, b, 0o600)
			os.Remove(e)
			os.Symlink(victim, e)
		},
		"foreign owner": func(t *testing.T, e string) {
			o := testutil.OtherUser(t)
			os.Chown(e, int(o.UID), int(o.GID))
		},
	}
	for name, spoil := range cases {
		t.Run(name, func(t *testing.T) {
			c := openCache(t)
			c.SetVerified(list, scan)
			spoil(t, entryPath(t, c))
			if c.Verified(list, scan) {
				t.Fatal("a spoiled record was used")
			}
			c.SetVerified(list, scan) // made anew
			if !c.Verified(list, scan) {
				t.Fatal("no record after it was made anew")
			}
		})
	}
}

// TestToolID: the program's identity in every key is the hash of its Go
// build ID, as `go tool buildid` prints it, read from the executable's
// first page.
func TestToolID(t *testing.T) {
	id, err := toolID()
	if err != nil {
		t.Fatal(err)
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	out, err := exec.Command("go", "tool", "buildid", exe).Output()
	if err != nil {
		t.Fatalf("go tool buildid: %v", err)
	}
	want := sha256.Sum256(bytes.TrimSpace(out))
	if !bytes.Equal(id, want[:]) {
		t.Fatalf("tool id %x, want the SHA-256 of the build ID %q", id, bytes.TrimSpace(out))
	}
}

// TestOpenRefusesForeignAncestors: a cache path that passes through a
// directory another user owns or may write, or through a symlink another
// user planted (in a sticky directory, as in /tmp), is refused, and nothing
// is created where such a directory or symlink leads; a path through our own
// symlink is followed.
func TestOpenRefusesForeignAncestors(t *testing.T) {
	other := testutil.OtherUser(t)
	base := t.TempDir()
	mk := func(name string, mode os.FileMode) string {
		p := filepath.Join(base, name)
		if err := os.Mkdir(p, mode); err != nil {
			t.Fatal(err)
		}
		if err := os.Chmod(p, mode); err != nil {
			t.Fatal(err)
		}
		return p
	}
	foreign := mk("foreign", 0o755)
	if err := os.Chown(foreign, int(other.UID), int(other.GID)); err != nil {
		t.Fatal(err)
	}
	open := mk("open", 0o777)
	sticky := mk("sticky", 0o777|os.ModeSticky)
	victim := mk("victim", 0o755)
	planted := filepath.Join(sticky, "planted")
	if err := os.Symlink(victim, planted); err != nil {
		t.Fatal(err)
	}
	if err := os.Lchown(planted, int(other.UID), int(other.GID)); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ path, notMade string }{
		{filepath.Join(foreign, "cache"), filepath.Join(foreign, "cache")},
		{filepath.Join(open, "cache"), filepath.Join(open, "cache")},
		{filepath.Join(planted, "cache"), filepath.Join(victim, "cache")},
		{filepath.Join(planted, "deeper", "cache"), filepath.Join(victim, "deeper")},
	} {
		if opened, err := Open(c.path); !errors.Is(err, ErrUnsafe) {
			if opened != nil {
				opened.Close()
			}
			t.Errorf("%s: %v, want ErrUnsafe", c.path, err)
		}
		if _, err := os.Lstat(c.notMade); !errors.Is(err, os.ErrNotExist) {
			t.Errorf("%s: opening it made %s (%v)", c.path, c.notMade, err)
		}
	}
	// Our own symlink (and a sticky directory's name of ours) is followed.
	real := mk("real", 0o755)
	mine := filepath.Join(sticky, "mine")
	if err := os.Symlink(real, mine); err != nil {
		t.Fatal(err)
	}
	c, err := Open(filepath.Join(mine, "cache"))
	if err != nil {
		t.Fatalf("through our own symlink: %v", err)
	}
	c.Close()
	if st, err := os.Stat(filepath.Join(real, "cache")); err != nil || st.Mode().Perm() != 0o700 {
		t.Errorf("the cache through our symlink: %v %v, want a 0700 directory", st, err)
	}
}

// TestFacts: an object's facts (a payload another package derives from its
// file) are derived once and then read from the cache while the file is
// unchanged; an entry that is damaged, shared or not accepted by decode is
// ignored and rebuilt; nothing is stored for a file changed too recently
// (racy) or without a cache; a different name is a different entry.
func TestFacts(t *testing.T) {
	fx := testutil.Build(t, testutil.Spec{Sources: []string{"mt.c"}})
	p := testutil.Start(t, nil, fx.Path)
	objs, err := procmaps.Objects(p.Pid)
	if err != nil {
		t.Fatal(err)
	}
	var o *procmaps.Object
	for i := range objs {
		if strings.Contains(objs[i].Path, filepath.Base(fx.Path)) {
			o = &objs[i]
		}
	}
	if o == nil {
		t.Fatalf("%s is not mapped", fx.Path)
	}
	derived := 0
	derive := func(f *os.File) ([]byte, error) {
		derived++
		st, err := f.Stat()
		if err != nil {
			return nil, err
		}
		return []byte(fmt.Sprintf("facts of %d bytes", st.Size())), nil
	}
	want := fmt.Sprintf("facts of %d bytes", o.Size)
	facts := func(c *Cache, name string, accept bool) {
		t.Helper()
		var got string
		err := c.Facts(p.Pid, o, name, derive, func(b []byte) error {
			if !accept && derived == 0 {
				return errors.New("refused")
			}
			got = string(b)
			return nil
		})
		if err != nil || got != want {
			t.Fatalf("Facts: %q, %v; want %q", got, err, want)
		}
	}

	c := openCache(t)
	later(c)
	facts(c, "t/1", true)
	facts(c, "t/1", true)
	if derived != 1 {
		t.Fatalf("derived %d times, want once", derived)
	}
	if h, m := c.FactsStats(); h != 1 || m != 1 {
		t.Fatalf("%d hits and %d misses, want 1 and 1", h, m)
	}
	expectStats(t, c, 0, 0) // lists, scans and records only
	facts(c, "t/2", true)   // another name: another entry
	if derived != 2 {
		t.Fatalf("a new name derived %d times in all, want 2", derived)
	}

	spoil := map[string]func(e string){
		"payload byte": func(e string) {
			b, _ := os.ReadFile(e)
			b[len(b)-1] ^= 0xff // the CRC covers a facts payload
			os.WriteFile(e, b, 0o600)
		},
		"truncated":      func(e string) { os.Truncate(e, entryHeaderSize+2) },
		"other writable": func(e string) { os.Chmod(e, 0o666) },
		"decode refuses": func(string) {},
	}
	for name, fn := range spoil {
		t.Run(name, func(t *testing.T) {
			c := openCache(t)
			later(c)
			derived = 0
			facts(c, "t/1", true)
			fn(entryPath(t, c))
			derived = 0
			facts(c, "t/1", name != "decode refuses")
			if derived != 1 {
				t.Fatalf("a spoiled entry used: derived %d times, want 1", derived)
			}
			if st, err := os.Lstat(entryPath(t, c)); err != nil || st.Mode().Perm() != 0o600 {
				t.Fatalf("rebuilt entry: %v %v", st.Mode(), err)
			}
			derived = 0
			facts(c, "t/1", true)
			if derived != 0 {
				t.Fatal("the rebuilt entry was not used")
			}
		})
	}

	t.Run("racy", func(t *testing.T) {
		var st unix.Stat_t
		if err := unix.Stat(fx.Path, &st); err != nil {
			t.Fatal(err)
		}
		c := openCache(t)
		c.now = func() time.Time { return time.Unix(0, st.Ctim.Nano()) } // as if just written
		derived = 0
		facts(c, "t/1", true)
		facts(c, "t/1", true)
		if m, _ := filepath.Glob(filepath.Join(c.Path(), "*.epc")); derived != 2 || len(m) != 0 {
			t.Fatalf("racy file: derived %d times, %d entries; want 2 and none", derived, len(m))
		}
	})
	t.Run("no cache", func(t *testing.T) {
		derived = 0
		facts(nil, "t/1", true)
		facts(nil, "t/1", true)
		if derived != 2 {
			t.Fatalf("derived %d times, want 2", derived)
		}
	})
}
