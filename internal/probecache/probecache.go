package probecache

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"debug/elf"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/elfnote"
	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/elfscan"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
)

// EnvDir names the environment variable that overrides DefaultDir; "off"
// turns the cache off.
const EnvDir = "EDGEPROBE_CACHE"

// SystemDir is root's cache directory.
const SystemDir = "/var/cache/edgeprobe"

// Sentinel errors of Open.
var (
	ErrDisabled = errors.New("probe cache disabled")
	ErrUnsafe   = errors.New("probe cache directory is not private")
)

// Limits: past either, the least recently written entries go.
var (
	maxEntries       = 512
	maxBytes   int64 = 512 << 20
)

// DefaultDir is $EDGEPROBE_CACHE if set ("" when it is "off"); else, for
// root, SystemDir; else $XDG_CACHE_HOME/edgeprobe, with XDG_CACHE_HOME
// defaulting to $HOME/.cache ("" without a home).
func DefaultDir() string { return defaultDir(os.Geteuid(), os.Getenv) }

func defaultDir(euid int, getenv func(string) string) string {
	if d := getenv(EnvDir); d != "" {
		if d == "off" {
			return ""
		}
		return d
	}
	if euid == 0 {
		return SystemDir
	}
	base := getenv("XDG_CACHE_HOME")
	if base == "" || !filepath.IsAbs(base) { // the XDG spec: relative values are ignored
		home := getenv("HOME")
		if home == "" || !filepath.IsAbs(home) {
			return ""
		}
		base = filepath.Join(home, ".cache")
	}
	return filepath.Join(base, "edgeprobe")
}

// Cache is an open cache directory. A nil *Cache caches nothing: its
// methods read and scan every time.
type Cache struct {
	dir  int // O_DIRECTORY|O_NOFOLLOW descriptor; every access is relative to it
	path string
	tool []byte                           // this program's build identity, part of every key
	now  func() time.Time                 // the clock racy entries are judged by
	uid  int                              // the effective uid entries must belong to
	warn func(format string, args ...any) // where a rejected entry is reported; nil: nowhere

	hits, misses atomic.Int64
	// factHits, factMisses count Facts lookups apart: Stats is what the
	// lists, scans and verification records did (hotpatch -v).
	factHits, factMisses atomic.Int64
}

// FactsStats returns how many Facts lookups found a usable entry and how
// many did not.
func (c *Cache) FactsStats() (hits, misses int64) {
	if c == nil {
		return 0, 0
	}
	return c.factHits.Load(), c.factMisses.Load()
}

// Stats returns how many lookups of lists, scans and verification records
// found a usable entry and how many did not (Facts: FactsStats).
func (c *Cache) Stats() (hits, misses int64) {
	if c == nil {
		return 0, 0
	}
	return c.hits.Load(), c.misses.Load()
}

var (
	defaultOnce  sync.Once
	defaultCache *Cache
	defaultErr   error
)

// Default opens DefaultDir once per process. A nil Cache with an error
// says why nothing is cached (ErrDisabled when it is off or impossible,
// ErrUnsafe when the directory is not private).
func Default() (*Cache, error) {
	defaultOnce.Do(func() { defaultCache, defaultErr = Open(DefaultDir()) })
	return defaultCache, defaultErr
}

// Open opens (creating it 0700 if missing) the cache directory at path and
// checks it is private: a directory, not a symlink, owned by the effective
// user, with no group or other access.
func Open(path string) (*Cache, error) {
	if path == "" {
		return nil, fmt.Errorf("%w (%s=off, or no home directory)", ErrDisabled, EnvDir)
	}
	tool, err := toolID()
	if err != nil {
		return nil, fmt.Errorf("%w: %v", ErrDisabled, err)
	}
	uid := os.Geteuid()
	fd, err := openPrivatePath(path, uid)
	if err != nil {
		return nil, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s: %v", ErrDisabled, path, err)
	}
	if int(st.Uid) != uid || st.Mode&0o077 != 0 {
		unix.Close(fd)
		return nil, fmt.Errorf("%w: %s is owned by uid %d with mode %#o; want uid %d and mode 0700", ErrUnsafe, path, st.Uid, st.Mode&0o7777, uid)
	}
	return &Cache{dir: fd, path: path, tool: tool, now: time.Now, uid: uid}, nil
}

// maxLinks bounds the symlinks openPrivatePath follows (the kernel's own limit).
const maxLinks = 40

// openPrivatePath opens the directory at path, creating missing components
// 0700, one component at a time relative to the last (O_NOFOLLOW), and
// refuses it (ErrUnsafe) when another user could change where it leads: every
// directory on the way must be owned by root or uid and writable by no one
// else unless it is sticky (like /tmp: there only a name's owner can replace
// it, and the next component's owner is checked in turn); a symlink on the
// way must be owned by root or uid, and the last component must not be one.
// Nothing is created beyond a component that fails: a symlink another user
// planted where the path passes never gets a directory made through it.
func openPrivatePath(path string, uid int) (int, error) {
	abs, err := filepath.Abs(path)
	if err != nil {
		return -1, fmt.Errorf("%w: %s: %v", ErrDisabled, path, err)
	}
	fd, err := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return -1, fmt.Errorf("%w: /: %v", ErrDisabled, err)
	}
	unsafe := func(format string, args ...any) (int, error) {
		unix.Close(fd)
		return -1, fmt.Errorf("%w: %s: %s", ErrUnsafe, path, fmt.Sprintf(format, args...))
	}
	owned := func(st *unix.Stat_t) bool { return st.Uid == 0 || int(st.Uid) == uid }
	comps := strings.Split(abs, "/")
	where := ""
	for links := 0; len(comps) > 0; {
		c := comps[0]
		comps = comps[1:]
		if c == "" || c == "." {
			continue
		}
		last := len(comps) == 0
		where += "/" + c
		if err := unix.Mkdirat(fd, c, 0o700); err != nil && err != unix.EEXIST {
			unix.Close(fd)
			return -1, fmt.Errorf("%w: mkdir %s: %v", ErrDisabled, where, err)
		}
		next, err := unix.Openat(fd, c, unix.O_RDONLY|unix.O_DIRECTORY|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0)
		if err == unix.ELOOP || err == unix.ENOTDIR {
			var st unix.Stat_t
			if serr := unix.Fstatat(fd, c, &st, unix.AT_SYMLINK_NOFOLLOW); serr != nil || st.Mode&unix.S_IFMT != unix.S_IFLNK {
				return unsafe("%s is not a directory", where)
			}
			if last {
				return unsafe("%s is a symlink (refused)", where)
			}
			if !owned(&st) {
				return unsafe("%s is a symlink of uid %d", where, st.Uid)
			}
			if links++; links > maxLinks {
				return unsafe("too many symlinks")
			}
			buf := make([]byte, unix.PathMax)
			n, rerr := unix.Readlinkat(fd, c, buf)
			if rerr != nil {
				return unsafe("%s: %v", where, rerr)
			}
			target := string(buf[:n])
			if strings.HasPrefix(target, "/") {
				root, oerr := unix.Open("/", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
				if oerr != nil {
					return unsafe("/: %v", oerr)
				}
				unix.Close(fd)
				fd, where = root, ""
			} else {
				where = filepath.Dir(where)
			}
			comps = append(strings.Split(target, "/"), comps...)
			continue
		}
		if err != nil {
			return unsafe("%v", err)
		}
		var st unix.Stat_t
		if err := unix.Fstat(next, &st); err != nil {
			unix.Close(next)
			return unsafe("%v", err)
		}
		unix.Close(fd)
		fd = next
		if !last && (!owned(&st) || st.Mode&0o022 != 0 && st.Mode&unix.S_ISVTX == 0) {
			return unsafe("the directory %s (uid %d, mode %#o) lets another user replace what is in it", where, st.Uid, st.Mode&0o7777)
		}
	}
	return fd, nil
}

// Path is the directory.
func (c *Cache) Path() string { return c.path }

// Close closes the directory. Indexes from the cache stay usable.
func (c *Cache) Close() error { return unix.Close(c.dir) }

// Go's build ID note (name "Go", type 4) and the GNU build-id note.
const (
	noteGoBuildID  = 4
	noteGNUBuildID = 3
)

// toolID is the SHA-256 of this program's Go build ID (or else its GNU
// build-id): any change to the program changes it, and with it every key.
// The note is read from the PT_NOTE segments in the executable's first
// page, where Go's linker puts it, without reading the section headers of
// the whole (megabytes) file on every start (D67); debug/elf finds it
// where that fails.
func toolID() ([]byte, error) {
	f, err := procfs.Open("/proc/self/exe")
	if err != nil {
		return nil, err
	}
	defer f.Close()
	var head [4096]byte
	n, _ := f.ReadAt(head[:], 0)
	if _, progs, ok := procmaps.ProgHeaders(head[:n]); ok {
		for _, want := range []struct {
			name string
			typ  uint32
		}{{"Go", noteGoBuildID}, {"GNU", noteGNUBuildID}} {
			for _, p := range progs {
				if p.Type == elf.PT_NOTE && p.Off <= uint64(n) && p.Filesz <= uint64(n)-p.Off {
					if id := elfnote.Find(head[p.Off:p.Off+p.Filesz], binary.LittleEndian, want.name, want.typ); id != nil {
						sum := sha256.Sum256(id)
						return sum[:], nil
					}
				}
			}
		}
	}
	ef, err := elf.NewFile(f)
	if err != nil {
		return nil, err
	}
	for _, s := range []struct {
		section, name string
		typ           uint32
	}{{".note.go.buildid", "Go", noteGoBuildID}, {".note.gnu.build-id", "GNU", noteGNUBuildID}} {
		if sec := ef.Section(s.section); sec != nil {
			if b, err := sec.Data(); err == nil {
				if id := elfnote.Find(b, ef.ByteOrder, s.name, s.typ); id != nil {
					sum := sha256.Sum256(id)
					return sum[:], nil
				}
			}
		}
	}
	return nil, errors.New("this program carries no build id")
}

// Entry kinds.
const (
	kindList     byte = 1
	kindScan     byte = 2
	kindVerified byte = 3
	kindFacts    byte = 4
)

// source is what an entry was made from: a file's identity when it was
// read, and when that was.
type source struct {
	dev, ino           uint64
	size, mtime, ctime int64 // ns since the epoch
	statTime           int64 // our clock, just before the stat
	content            [32]byte
}

func (s *source) sameFile(o *source) bool {
	return s.dev == o.dev && s.ino == o.ino && s.size == o.size && s.mtime == o.mtime && s.ctime == o.ctime
}

// racyMargin is how long after a file's ctime a change to it may still
// leave the ctime as it was: a timestamp tick (4-10 ms on Linux's coarse
// clock), or a second or two on filesystems that keep whole seconds, which
// show as a zero nanosecond part.
func racyMargin(s *source) int64 {
	if s.mtime%1e9 == 0 && s.ctime%1e9 == 0 {
		return int64(2 * time.Second)
	}
	return int64(100 * time.Millisecond)
}

// racy reports whether the file may have changed after statTime without
// its ctime changing.
func (s *source) racy() bool { return s.ctime+racyMargin(s) > s.statTime }

// stat describes f as of now.
func (c *Cache) stat(f *os.File) (source, error) {
	now := time.Now
	if c != nil {
		now = c.now
	}
	s := source{statTime: now().UnixNano()}
	var st unix.Stat_t
	if err := unix.Fstat(int(f.Fd()), &st); err != nil {
		return s, err
	}
	s.dev, s.ino, s.size = st.Dev, st.Ino, st.Size
	s.mtime, s.ctime = st.Mtim.Nano(), st.Ctim.Nano()
	return s, nil
}

func (c *Cache) key(kind byte, fields ...any) [32]byte {
	h := sha256.New()
	h.Write(c.tool)
	h.Write([]byte{kind})
	for _, f := range fields {
		fmt.Fprintf(h, "%v\x00", f)
	}
	var k [32]byte
	copy(k[:], h.Sum(nil))
	return k
}

// List returns the probe list in the JSON file at path, from the cache
// when an entry made from this file, unchanged, is there; otherwise it
// reads and checks the JSON (errors name the file) and stores the result.
func (c *Cache) List(path string) (*probelist.Index, error) {
	// A regular file of a bounded size only (probelist.OpenFile): never a
	// FIFO, a device or a file without end (D88).
	f, r, err := probelist.OpenFile(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	src, err := c.stat(f)
	if err != nil {
		return nil, err
	}
	var key [32]byte
	if c != nil {
		key = c.key(kindList, src.dev, src.ino)
		if e, ok := c.lookup(key, kindList, f, &src); ok && !e.noSites {
			return e.index, nil
		}
	}
	data, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	l, err := probelist.Read(bytes.NewReader(data))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	compact, x, err := compactOf(l, path)
	if err != nil {
		return nil, err
	}
	src.content = sha256.Sum256(data)
	c.store(key, kindList, f, &src, compact, false)
	return x, nil
}

// compactOf encodes l and opens the result; errors name where l came from.
func compactOf(l *probelist.List, from string) ([]byte, *probelist.Index, error) {
	compact, err := l.Compact()
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", from, err)
	}
	x, err := probelist.OpenCompact(compact)
	if err != nil {
		return nil, nil, fmt.Errorf("%s: %w", from, err)
	}
	return compact, x, nil
}

// Scan returns the scan of object o of process pid (the file it mapped,
// through map_files), with every hook site as a probe in the flip style,
// as coldpatch would list them: from the cache when it is there, else
// scanned and stored. An object that cannot have a site (elfscan
// .MayHaveSites: it names no hook, or defines the hooks and calls none)
// is not scanned. With no site, the error wraps elfscan.ErrNoHookSites.
//
// This is the scan the safety checks compare a site with: Index.At finds
// the probe listed at an address.
func (c *Cache) Scan(pid int, o *procmaps.Object) (*probelist.Index, error) {
	f, err := procmaps.Open(pid, o)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	src, err := c.stat(f)
	if err != nil {
		return nil, err
	}
	noSites := fmt.Errorf("%s: %w", o.Path, elfscan.ErrNoHookSites)
	var key [32]byte
	if c != nil {
		key = c.key(kindScan, o.BuildID, o.Path, src.dev, src.ino)
		if e, ok := c.lookup(key, kindScan, f, &src); ok {
			if e.noSites {
				return nil, noSites
			}
			return e.index, nil
		}
	}
	// What the object's headers describe, not a tail nothing uses: the
	// file may be another user's, with gigabytes of holes after its ELF
	// (elfsafe.Extent, D88).
	data, err := elfsafe.ReadObject(f)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", o.Path, err)
	}
	src.content = sha256.Sum256(data)
	may, err := elfscan.MayHaveSites(data, o.Path)
	if err != nil {
		return nil, err
	}
	if !may {
		c.store(key, kindScan, f, &src, nil, true)
		return nil, noSites
	}
	list, _, err := elfscan.ScanBytes(data, o.Path, elfscan.Options{Placeholder: probelist.PlaceholderFlip})
	if errors.Is(err, elfscan.ErrNoHookSites) {
		c.store(key, kindScan, f, &src, nil, true)
		return nil, noSites
	}
	if err != nil {
		return nil, err
	}
	compact, x, err := compactOf(list, o.Path)
	if err != nil {
		return nil, err
	}
	c.store(key, kindScan, f, &src, compact, false)
	return x, nil
}

// The entry file: a fixed header, then the compact list.
const (
	entryMagic      = "EPCACHE2" // 2: the CRC is CRC-32 (IEEE) over the header (D67)
	entryHeaderSize = 144
)

type entry struct {
	index   *probelist.Index
	noSites bool
}

func entryName(key [32]byte) string { return hex.EncodeToString(key[:20]) + ".epc" }

func encodeEntry(key [32]byte, kind byte, src *source, payload []byte, noSites bool) []byte {
	b := make([]byte, entryHeaderSize, entryHeaderSize+len(payload))
	le := binary.LittleEndian
	copy(b, entryMagic)
	b[8] = kind
	if noSites {
		b[9] = 1
	}
	copy(b[16:48], key[:])
	le.PutUint64(b[48:], src.dev)
	le.PutUint64(b[56:], src.ino)
	le.PutUint64(b[64:], uint64(src.size))
	le.PutUint64(b[72:], uint64(src.mtime))
	le.PutUint64(b[80:], uint64(src.ctime))
	le.PutUint64(b[88:], uint64(src.statTime))
	copy(b[96:128], src.content[:])
	le.PutUint64(b[128:], uint64(len(payload)))
	b = append(b, payload...)
	le.PutUint32(b[136:], entryCRC(b))
	return b
}

// entryCRC covers the entry's header but the CRC itself and, for a
// verification record, its payload (the two digests, which nothing else
// checks). A list or scan entry's payload is a compact list, which checks
// itself where it is used: its header, header strings and name index when
// opened, each record with its strings when first decoded
// (probelist.OpenCompact, Index.Probe). Checking all of it here would read
// every byte of an entry of megabytes on every call, a cost that grows with
// the program for a toggle that decodes two records (D67). A corrupt record
// is refused when decoded, and its entry removed (lookup).
func entryCRC(b []byte) uint32 {
	c := crc32.Update(0, crcTable, b[:136])
	if b[8] == kindVerified || b[8] == kindFacts {
		return crc32.Update(c, crcTable, b[140:])
	}
	return crc32.Update(c, crcTable, b[140:entryHeaderSize])
}

// crcTable is CRC-32 (IEEE): see probelist's, and D67.
var crcTable = crc32.IEEETable

// lookup returns the entry for key if it is there, sound, and made from the
// file f is now (src). A racy entry is used only if f's content hashes as it
// did; it is then rewritten, clean, when f has become old enough.
func (c *Cache) lookup(key [32]byte, kind byte, f *os.File, src *source) (entry, bool) {
	data, err := c.read(entryName(key))
	if err != nil {
		c.misses.Add(1)
		return entry{}, false
	}
	e, err := c.check(data, key, kind, f, src)
	if err != nil || e.index == nil {
		unix.Munmap(data) // an Index keeps its mapping for good
	}
	if err != nil {
		c.misses.Add(1)
		return entry{}, false
	}
	c.hits.Add(1)
	if e.index != nil {
		name := entryName(key)
		e.index.OnCorrupt("probe cache entry "+filepath.Join(c.path, name)+" (removed: the next call rebuilds it)", func() {
			c.remove(name, data)
		})
	}
	return e, true
}

// remove unlinks entry name if it still holds the bytes data were mapped
// from (another hotpatch may have rebuilt it meanwhile).
func (c *Cache) remove(name string, data []byte) {
	now, err := c.read(name)
	if err != nil {
		return
	}
	same := bytes.Equal(now[:entryHeaderSize], data[:entryHeaderSize])
	unix.Munmap(now)
	if same {
		unix.Unlinkat(c.dir, name, 0)
	}
}

var errStale = errors.New("stale entry")

func (c *Cache) check(data []byte, key [32]byte, kind byte, f *os.File, src *source) (entry, error) {
	le := binary.LittleEndian
	var was source
	was.dev, was.ino = le.Uint64(data[48:]), le.Uint64(data[56:])
	was.size, was.mtime, was.ctime = int64(le.Uint64(data[64:])), int64(le.Uint64(data[72:])), int64(le.Uint64(data[80:]))
	was.statTime = int64(le.Uint64(data[88:]))
	copy(was.content[:], data[96:128])
	e := entry{noSites: data[9] == 1}
	if string(data[:8]) != entryMagic || data[8] != kind || data[9] > 1 || !bytes.Equal(data[16:48], key[:]) ||
		le.Uint64(data[128:]) != uint64(len(data)-entryHeaderSize) || e.noSites != (len(data) == entryHeaderSize) ||
		le.Uint32(data[136:]) != entryCRC(data) {
		c.warnf("probe cache: %s is not an entry of this key; rebuilding it", entryName(key))
		return entry{}, errStale
	}
	if !was.sameFile(src) {
		return entry{}, errStale
	}
	if was.racy() {
		sum, err := contentHash(f, src.size)
		if err != nil || sum != was.content {
			return entry{}, errStale
		}
		src.content = sum
		if !src.racy() { // old enough now: this content is the file's for good
			c.write(entryName(key), encodeEntry(key, kind, src, data[entryHeaderSize:], e.noSites))
		}
	}
	if !e.noSites {
		x, err := probelist.OpenCompact(data[entryHeaderSize:])
		if err != nil {
			c.warnf("probe cache: %s: %v; rebuilding it", entryName(key), err)
			return entry{}, err
		}
		e.index = x
	}
	return e, nil
}

func contentHash(f *os.File, size int64) ([32]byte, error) {
	h := sha256.New()
	// The size at the open: a file growing meanwhile is not read without end.
	if _, err := io.Copy(h, io.NewSectionReader(f, 0, size)); err != nil {
		return [32]byte{}, err
	}
	var sum [32]byte
	copy(sum[:], h.Sum(nil))
	return sum, nil
}

// read maps an entry read-only, if it is a regular file of ours that no one
// else may write. The mapping stays for the life of the Index made from it.
func (c *Cache) read(name string) ([]byte, error) {
	fd, size, err := c.openEntry(name, maxBytes)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	// Not MAP_POPULATE: a toggle touches the header, the name index's
	// bisection and the records it selects, a few pages of megabytes.
	return unix.Mmap(fd, 0, int(size), unix.PROT_READ, unix.MAP_PRIVATE)
}

// readSmall is read for an entry of at most max bytes that is used and
// let go at once (a verification record, facts): read, not mapped, since
// unmapping in a process with several threads costs every CPU that runs
// one of them an interrupt to flush its TLB.
func (c *Cache) readSmall(name string, max int64) ([]byte, error) {
	fd, size, err := c.openEntry(name, max)
	if err != nil {
		return nil, err
	}
	defer unix.Close(fd)
	b := make([]byte, size)
	for off := 0; off < len(b); {
		n, err := unix.Pread(fd, b[off:], int64(off))
		if err == unix.EINTR {
			continue
		}
		if err != nil {
			return nil, err
		}
		if n == 0 {
			return nil, errors.New("entry size")
		}
		off += n
	}
	return b, nil
}

// openEntry opens entry name if it is a regular file of ours that no one
// else may write, of a size an entry can have (at most max bytes).
func (c *Cache) openEntry(name string, max int64) (int, int64, error) {
	fd, err := unix.Openat(c.dir, name, unix.O_RDONLY|unix.O_NOFOLLOW|unix.O_NONBLOCK|unix.O_CLOEXEC|unix.O_NOCTTY, 0)
	if err != nil {
		return -1, 0, err
	}
	var st unix.Stat_t
	if err := unix.Fstat(fd, &st); err != nil {
		unix.Close(fd)
		return -1, 0, err
	}
	if st.Mode&unix.S_IFMT != unix.S_IFREG || int(st.Uid) != c.uid || st.Mode&0o022 != 0 {
		unix.Close(fd)
		c.warnf("probe cache: %s is not a private regular file of uid %d (mode %#o, uid %d); ignored", name, c.uid, st.Mode, st.Uid)
		return -1, 0, ErrUnsafe
	}
	if st.Size < entryHeaderSize || st.Size > max {
		unix.Close(fd)
		return -1, 0, errors.New("entry size")
	}
	return fd, st.Size, nil
}

// store writes an entry for what was read from f, unless f changed while
// it was read (its identity is taken again) or c is nil.
func (c *Cache) store(key [32]byte, kind byte, f *os.File, src *source, payload []byte, noSites bool) {
	if c == nil {
		return
	}
	now, err := c.stat(f)
	if err != nil || !now.sameFile(src) {
		return
	}
	c.write(entryName(key), encodeEntry(key, kind, src, payload, noSites))
	c.prune()
}

var randReader = rand.Reader

// write puts data in place atomically: a new file (O_EXCL, 0600), then a
// rename over the old entry. Errors only cost the cache a miss.
func (c *Cache) write(name string, data []byte) {
	var rnd [8]byte
	if _, err := io.ReadFull(randReader, rnd[:]); err != nil {
		return
	}
	tmp := ".tmp-" + hex.EncodeToString(rnd[:])
	fd, err := unix.Openat(c.dir, tmp, unix.O_WRONLY|unix.O_CREAT|unix.O_EXCL|unix.O_NOFOLLOW|unix.O_CLOEXEC, 0o600)
	if err != nil {
		return
	}
	f := os.NewFile(uintptr(fd), tmp)
	_, err = f.Write(data)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = unix.Renameat(c.dir, tmp, c.dir, name)
	}
	if err != nil {
		unix.Unlinkat(c.dir, tmp, 0)
	}
}

// prune keeps the directory under maxEntries and maxBytes, dropping the
// entries written longest ago, and removes temporary files a killed
// writer left over a minute ago.
func (c *Cache) prune() {
	names, err := c.names()
	if err != nil {
		return
	}
	type ent struct {
		name  string
		size  int64
		mtime int64
	}
	var ents []ent
	var total int64
	for _, n := range names {
		var st unix.Stat_t
		if unix.Fstatat(c.dir, n, &st, unix.AT_SYMLINK_NOFOLLOW) != nil {
			continue
		}
		if strings.HasPrefix(n, ".tmp-") {
			if c.now().UnixNano()-st.Mtim.Nano() > int64(time.Minute) {
				unix.Unlinkat(c.dir, n, 0)
			}
			continue
		}
		ents = append(ents, ent{n, st.Size, st.Mtim.Nano()})
		total += st.Size
	}
	if len(ents) <= maxEntries && total <= maxBytes {
		return
	}
	sort.Slice(ents, func(i, j int) bool { return ents[i].mtime < ents[j].mtime })
	for _, e := range ents {
		if len(ents) <= maxEntries && total <= maxBytes {
			break
		}
		if unix.Unlinkat(c.dir, e.name, 0) == nil {
			total -= e.size
		}
		ents = ents[1:]
	}
}

// names lists the directory through its descriptor.
func (c *Cache) names() ([]string, error) {
	fd, err := unix.Openat(c.dir, ".", unix.O_RDONLY|unix.O_DIRECTORY|unix.O_CLOEXEC, 0)
	if err != nil {
		return nil, err
	}
	d := os.NewFile(uintptr(fd), c.path)
	defer d.Close()
	return d.Readdirnames(-1)
}

func (c *Cache) warnf(format string, args ...any) {
	if c.warn != nil {
		c.warn(format, args...)
	}
}

// SetWarn sets where rejected entries are reported (nil: nowhere).
func (c *Cache) SetWarn(w func(format string, args ...any)) {
	if c != nil {
		c.warn = w
	}
}

// Verified reports whether an entry says that every probe of the list
// whose compact form has digest list agreed with the scan whose compact
// form has digest scan (probelist.Index.Digest), as hotpatch checks them
// before writing. The entry is a file of the cache like any other (private,
// regular, ours, its checksum right) and holds both digests, which must be
// the ones asked: it stands for the check of those exact bytes, whichever
// files they were read from. A nil Cache has no entries.
func (c *Cache) Verified(list, scan [32]byte) bool {
	if c == nil {
		return false
	}
	key := c.key(kindVerified, hex.EncodeToString(list[:]), hex.EncodeToString(scan[:]))
	data, err := c.readSmall(entryName(key), entryHeaderSize+64)
	if err != nil {
		c.misses.Add(1)
		return false
	}
	le := binary.LittleEndian
	want := append(append([]byte(nil), list[:]...), scan[:]...)
	if string(data[:8]) != entryMagic || data[8] != kindVerified || data[9] != 0 || !bytes.Equal(data[16:48], key[:]) ||
		le.Uint64(data[128:]) != uint64(len(data)-entryHeaderSize) || le.Uint32(data[136:]) != entryCRC(data) ||
		!bytes.Equal(data[entryHeaderSize:], want) {
		c.warnf("probe cache: %s is not an entry of this key; ignored", entryName(key))
		c.misses.Add(1)
		return false
	}
	c.hits.Add(1)
	return true
}

// SetVerified records that every probe of list agreed with scan (Verified).
func (c *Cache) SetVerified(list, scan [32]byte) {
	if c == nil {
		return
	}
	key := c.key(kindVerified, hex.EncodeToString(list[:]), hex.EncodeToString(scan[:]))
	payload := append(append([]byte(nil), list[:]...), scan[:]...)
	c.write(entryName(key), encodeEntry(key, kindVerified, &source{}, payload, false))
	c.prune()
}

// maxFactsBytes bounds a facts payload (Facts): its CRC is checked whole on
// every use.
const maxFactsBytes = 64 << 10

// Facts gives decode what derive computes from the file of object o that
// pid maps (opened through map_files, as Scan opens it): a small payload,
// opaque to the cache, that another package derives from the file alone
// (inject: an object's hook slots and the symbols it defines). name says
// what the payload is (its deriver and format); with the object's
// build-id, path and file identity, and this program's build identity, it
// keys the entry. The entry is used only while the file's size, mtime and
// ctime are those recorded, and only if decode accepts it; it is a private
// file of the cache like every other, whose CRC covers the payload. Else
// derive reads the file and its result is decoded and stored; nothing is
// stored for a file changed too recently to tell a later change by its
// timestamps (racy), nor a payload over 64 KiB. A nil Cache derives every
// time.
func (c *Cache) Facts(pid int, o *procmaps.Object, name string, derive func(f *os.File) ([]byte, error), decode func([]byte) error) error {
	f, err := procmaps.Open(pid, o)
	if err != nil {
		return err
	}
	defer f.Close()
	src, err := c.stat(f)
	if err != nil {
		return err
	}
	var key [32]byte
	if c != nil {
		key = c.key(kindFacts, name, o.BuildID, o.Path, src.dev, src.ino)
		if payload, ok := c.lookupFacts(key, &src); ok {
			err := decode(payload)
			if err == nil {
				c.factHits.Add(1)
				return nil
			}
			c.warnf("probe cache: %s: %v; rebuilding it", entryName(key), err)
		}
		c.factMisses.Add(1)
	}
	payload, err := derive(f)
	if err != nil {
		return err
	}
	if err := decode(payload); err != nil {
		return err
	}
	if c != nil && !src.racy() && len(payload) <= maxFactsBytes {
		c.store(key, kindFacts, f, &src, payload, false)
	}
	return nil
}

// lookupFacts returns the payload of the facts entry for key (read, not
// mapped: readSmall) if it is there, sound and made from the file as it is
// now (src).
func (c *Cache) lookupFacts(key [32]byte, src *source) ([]byte, bool) {
	data, err := c.readSmall(entryName(key), entryHeaderSize+maxFactsBytes)
	if err != nil {
		return nil, false
	}
	le := binary.LittleEndian
	var was source
	was.dev, was.ino = le.Uint64(data[48:]), le.Uint64(data[56:])
	was.size, was.mtime, was.ctime = int64(le.Uint64(data[64:])), int64(le.Uint64(data[72:])), int64(le.Uint64(data[80:]))
	was.statTime = int64(le.Uint64(data[88:]))
	if string(data[:8]) != entryMagic || data[8] != kindFacts || data[9] != 0 || !bytes.Equal(data[16:48], key[:]) ||
		le.Uint64(data[128:]) != uint64(len(data)-entryHeaderSize) || len(data)-entryHeaderSize > maxFactsBytes ||
		le.Uint32(data[136:]) != entryCRC(data) {
		c.warnf("probe cache: %s is not an entry of this key; rebuilding it", entryName(key))
		return nil, false
	}
	// Stored only when not racy (Facts): the timestamps decide.
	if !was.sameFile(src) || was.racy() {
		return nil, false
	}
	return data[entryHeaderSize:], true
}
