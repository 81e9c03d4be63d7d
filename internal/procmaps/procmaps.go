package procmaps

import (
	"bufio"
	"bytes"
	"debug/elf"
	"encoding/binary"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
	"strings"

	"github.com/edgeprobe/edgeprobe/internal/elfnote"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// Sentinel errors.
var (
	// ErrNoProcess: /proc/PID/maps does not exist.
	ErrNoProcess = procfs.ErrNoProcess // the one every package wraps
	// ErrNotELF: a mapped object's file is not an ELF file we can read.
	ErrNotELF = errors.New("not a readable ELF object")
	// ErrNoObject: no mapped object matched.
	ErrNoObject = errors.New("object not mapped")
)

// Mapping is one line of /proc/PID/maps.
type Mapping struct {
	Start, End uint64
	Perms      string // e.g. "r-xp"
	Offset     uint64 // file offset of Start
	Dev        string // "major:minor"
	Inode      uint64
	Path       string // without the " (deleted)" suffix
	Deleted    bool   // the file was deleted (or replaced) since it was mapped
}

// Exec reports whether the mapping is executable.
func (m Mapping) Exec() bool { return len(m.Perms) > 2 && m.Perms[2] == 'x' }

// Range is a half-open run-time address range.
type Range struct{ Start, End uint64 }

// Contains reports whether [addr, addr+n) lies inside r.
func (r Range) Contains(addr, n uint64) bool {
	return addr >= r.Start && addr+n <= r.End && addr+n >= addr
}

// Object is one ELF file mapped into the process.
type Object struct {
	Path     string
	Deleted  bool
	Dev      string
	Inode    uint64
	Type     elf.Type // ET_EXEC or ET_DYN
	BuildID  string   // hex GNU build-id, "" if the object has none
	Size     int64    // size of the mapped file
	Bias     uint64   // run-time address = ELF virtual address + Bias
	Exec     []Range  // executable mappings, run-time addresses
	Mappings []Mapping
}

// Runtime converts an ELF virtual address of the object to a run-time address.
func (o *Object) Runtime(vaddr uint64) uint64 { return vaddr + o.Bias }

// InExec reports whether the run-time range [addr, addr+n) lies wholly in one
// executable mapping of the object.
func (o *Object) InExec(addr, n uint64) bool {
	for _, r := range o.Exec {
		if r.Contains(addr, n) {
			return true
		}
	}
	return false
}

// Read parses /proc/PID/maps.
func Read(pid int) ([]Mapping, error) { return readMaps(pid, nil) }

// Parse parses the text of a maps file.
func Parse(r io.Reader) ([]Mapping, error) { return parse(r, nil) }

// ReadExec is Read keeping only the executable mappings (Mapping.Exec).
// A large flip batch reads the maps twice (hotpatch's pristine check) and
// needs only those: a line it does not keep is not converted or parsed,
// which costs no allocation.
func ReadExec(pid int) ([]Mapping, error) { return readMaps(pid, execField) }

// ParseExec is Parse keeping only the executable mappings: on input Parse
// accepts it returns exactly Parse's executable mappings. A line whose
// second field does not mark it executable is skipped unread, so a
// malformed one is an error only if it looks executable (FuzzParseExec).
func ParseExec(r io.Reader) ([]Mapping, error) { return parse(r, execField) }

// readMaps opens /proc/PID/maps and parses it (keep: see parse).
func readMaps(pid int, keep func([]byte) bool) ([]Mapping, error) {
	f, err := procfs.Open(fmt.Sprintf("/proc/%d/maps", pid))
	if err != nil {
		if os.IsNotExist(err) {
			return nil, fmt.Errorf("pid %d: %w", pid, ErrNoProcess)
		}
		return nil, err
	}
	defer f.Close()
	ms, err := parse(f, keep)
	if err == nil && len(ms) == 0 && procfs.LeaderExited(pid) {
		// An exited main thread has no memory to show: the process's
		// maps are not readable through it (procfs.ErrLeaderExited).
		return nil, fmt.Errorf("pid %d: %w", pid, procfs.ErrLeaderExited)
	}
	return ms, err
}

// parse parses the lines of a maps file that keep accepts (nil: every line).
func parse(r io.Reader, keep func([]byte) bool) ([]Mapping, error) {
	var out []Mapping
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 4<<10), 1<<20)
	for n := 1; sc.Scan(); n++ {
		if keep != nil && !keep(sc.Bytes()) {
			continue
		}
		m, err := parseLine(sc.Text())
		if err != nil {
			return nil, fmt.Errorf("maps line %d: %w", n, err)
		}
		out = append(out, m)
	}
	return out, sc.Err()
}

// execField reports whether line's second field, split as parseLine splits
// it, marks an executable mapping ("r-xp": its third byte is x).
func execField(line []byte) bool {
	field := func(b []byte) (tok, rest []byte) {
		b = bytes.TrimLeft(b, " ")
		if i := bytes.IndexByte(b, ' '); i >= 0 {
			return b[:i], b[i:]
		}
		return b, nil
	}
	_, rest := field(line)
	perms, _ := field(rest)
	return len(perms) > 2 && perms[2] == 'x'
}

func parseLine(line string) (Mapping, error) {
	var m Mapping
	// address perms offset dev inode [path]; the path may contain spaces.
	fields := make([]string, 0, 5)
	rest := line
	for len(fields) < 5 {
		rest = strings.TrimLeft(rest, " ")
		i := strings.IndexByte(rest, ' ')
		if i < 0 {
			fields = append(fields, rest)
			rest = ""
			break
		}
		fields = append(fields, rest[:i])
		rest = rest[i:]
	}
	if len(fields) < 5 {
		return m, fmt.Errorf("malformed %q", line)
	}
	lo, hi, ok := strings.Cut(fields[0], "-")
	var err1, err2, err3, err4 error
	m.Start, err1 = strconv.ParseUint(lo, 16, 64)
	m.End, err2 = strconv.ParseUint(hi, 16, 64)
	m.Offset, err3 = strconv.ParseUint(fields[2], 16, 64)
	m.Inode, err4 = strconv.ParseUint(fields[4], 10, 64)
	if !ok || err1 != nil || err2 != nil || err3 != nil || err4 != nil || len(fields[1]) != 4 {
		return m, fmt.Errorf("malformed %q", line)
	}
	m.Perms, m.Dev = fields[1], fields[3]
	m.Path = strings.TrimLeft(rest, " ")
	if p, ok := strings.CutSuffix(m.Path, " (deleted)"); ok && m.Inode != 0 {
		m.Path, m.Deleted = p, true
	}
	return m, nil
}

// Objects returns every file-backed ELF object mapped into pid, in address
// order. Mappings of files that are not ELF (locale archives, fonts) are
// skipped; an ELF object whose headers cannot be read is an error naming it.
func Objects(pid int) ([]Object, error) {
	maps, err := Read(pid)
	if err != nil {
		return nil, err
	}
	return ObjectsOf(maps, Opener(pid))
}

// ObjectsOf returns the ELF objects of a maps listing, opening each object's
// file with open: the live process's map_files for Objects, or the files on
// disk for a maps copy saved by an exited process.
func ObjectsOf(maps []Mapping, open func(Mapping) (*os.File, error)) ([]Object, error) {
	type key struct {
		dev   string
		inode uint64
		path  string
	}
	var order []key
	groups := map[key][]Mapping{}
	for _, m := range maps {
		if m.Inode == 0 || !strings.HasPrefix(m.Path, "/") {
			continue
		}
		k := key{m.Dev, m.Inode, m.Path}
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], m)
	}
	var out []Object
	for _, k := range order {
		ms := groups[k]
		if !hasExec(ms) {
			continue // data-only file mappings cannot hold probe sites
		}
		o, err := inspect(open, ms)
		if errors.Is(err, ErrNotELF) {
			continue
		}
		if err != nil {
			return nil, err
		}
		out = append(out, o)
	}
	return out, nil
}

func hasExec(ms []Mapping) bool {
	for _, m := range ms {
		if m.Exec() {
			return true
		}
	}
	return false
}

// Find returns the object whose path (as mapped) equals path; if none does,
// the one whose base name matches uniquely.
func Find(pid int, path string) (*Object, error) {
	objs, err := Objects(pid)
	if err != nil {
		return nil, err
	}
	var base []int
	for i := range objs {
		if objs[i].Path == path {
			return &objs[i], nil
		}
		if lastElem(objs[i].Path) == lastElem(path) {
			base = append(base, i)
		}
	}
	if len(base) == 1 {
		return &objs[base[0]], nil
	}
	return nil, fmt.Errorf("%s in pid %d: %w", path, pid, ErrNoObject)
}

// Opener opens the file behind a mapping of the live process pid, for
// ObjectsOf: map_files first (the mapped inode itself), then the path as the
// process sees it. Objects(pid) is ObjectsOf(Read(pid), Opener(pid)).
func Opener(pid int) func(Mapping) (*os.File, error) {
	return func(m Mapping) (*os.File, error) { return openMapped(pid, m) }
}

// Main returns the main executable's object (the one /proc/PID/exe names).
func Main(pid int) (*Object, error) {
	objs, err := Objects(pid)
	if err != nil {
		return nil, err
	}
	return MainOf(pid, objs)
}

// MainOf is Main among objs, objects of pid read already (Objects): one
// read of the maps for a caller that needs both.
func MainOf(pid int, objs []Object) (*Object, error) {
	var st os.FileInfo
	var err error
	if st, err = os.Stat(fmt.Sprintf("/proc/%d/exe", pid)); err == nil {
		for i := range objs {
			if inodeOf(st) == objs[i].Inode {
				return &objs[i], nil
			}
		}
	}
	exe, _ := os.Readlink(fmt.Sprintf("/proc/%d/exe", pid))
	exe = strings.TrimSuffix(exe, " (deleted)")
	for i := range objs {
		if objs[i].Path == exe {
			return &objs[i], nil
		}
	}
	return nil, fmt.Errorf("main executable of pid %d: %w", pid, ErrNoObject)
}

func lastElem(p string) string { return p[strings.LastIndexByte(p, '/')+1:] }

// openMapped opens the file behind a mapping: map_files first (the mapped
// inode itself), then the path as the process sees it.
func openMapped(pid int, m Mapping) (*os.File, error) {
	f, err := procfs.Open(fmt.Sprintf("/proc/%d/map_files/%x-%x", pid, m.Start, m.End))
	if err == nil {
		return f, nil
	}
	if m.Deleted {
		return nil, fmt.Errorf("%s (deleted): map_files: %w", m.Path, err)
	}
	// The path is the process's user's to change: a regular file only, and
	// no other kind of file's open run (a FIFO waits, a device's open has
	// its effects: procfs.OpenRegular, D88).
	f, err2 := procfs.OpenRegular(fmt.Sprintf("/proc/%d/root%s", pid, m.Path))
	if errors.Is(err2, procfs.ErrNotRegular) {
		return nil, fmt.Errorf("%s: %v; %v: %w", m.Path, err, err2, ErrNotELF)
	}
	if err2 != nil {
		return nil, fmt.Errorf("%s: %v; %w", m.Path, err, err2)
	}
	// The path may now name another file: insist on the mapped inode.
	if st, err := f.Stat(); err == nil && inodeOf(st) != m.Inode {
		f.Close()
		return nil, fmt.Errorf("%s: replaced on disk since it was mapped and map_files is unavailable: %w", m.Path, ErrNotELF)
	}
	return f, nil
}

func inspect(open func(Mapping) (*os.File, error), ms []Mapping) (Object, error) {
	o := Object{Path: ms[0].Path, Deleted: ms[0].Deleted, Dev: ms[0].Dev, Inode: ms[0].Inode, Mappings: ms}
	var exe Mapping
	for _, m := range ms {
		if m.Exec() {
			o.Exec = append(o.Exec, Range{m.Start, m.End})
			if exe.End == 0 {
				exe = m
			}
		}
	}
	f, err := open(exe)
	if err != nil {
		return o, err
	}
	defer f.Close()
	if st, err := f.Stat(); err == nil {
		o.Size = st.Size()
	}
	var head [4096]byte
	n, _ := f.ReadAt(head[:], 0)
	if n < 4 || string(head[:4]) != elf.ELFMAG {
		return o, fmt.Errorf("%s: %w", o.Path, ErrNotELF)
	}
	typ, progs, ok := ProgHeaders(head[:n])
	var ef *elf.File
	if !ok {
		// Not the common case (ELF64 little-endian, program headers in
		// the first page): debug/elf reads it.
		if ef, err = elf.NewFile(f); err != nil {
			return o, fmt.Errorf("%s: %v: %w", o.Path, err, ErrNotELF)
		}
		typ, progs = ef.Type, ef.Progs
	}
	o.Type = typ
	bias, err := loadBias(typ, progs, ms)
	if err != nil {
		return o, fmt.Errorf("%s: %w", o.Path, err)
	}
	o.Bias = bias
	order := binary.ByteOrder(binary.LittleEndian)
	if ef != nil {
		order = ef.ByteOrder
	}
	o.BuildID = buildID(f, progs, order)
	return o, nil
}

// ProgHeaders reads an ELF64 little-endian file's type and program
// headers from its first bytes (head), as debug/elf would: only those, so
// that listing a process's objects on every hotpatch call does not read
// and allocate each object's section headers and their names (D67). ok is
// false for anything else (another class or byte order, program headers
// past head, PN_XNUM, malformed sizes): the caller then uses debug/elf.
func ProgHeaders(head []byte) (elf.Type, []*elf.Prog, bool) {
	const ehdrSize, phdrSize = 64, 56
	if len(head) < ehdrSize || head[elf.EI_CLASS] != byte(elf.ELFCLASS64) || head[elf.EI_DATA] != byte(elf.ELFDATA2LSB) ||
		head[elf.EI_VERSION] != byte(elf.EV_CURRENT) {
		return 0, nil, false
	}
	le := binary.LittleEndian
	typ := elf.Type(le.Uint16(head[16:]))
	phoff, phentsize, phnum := le.Uint64(head[32:]), int(le.Uint16(head[54:])), int(le.Uint16(head[56:]))
	if phnum == 0xffff || phnum > 0 && phentsize < phdrSize || phoff > uint64(len(head)) || uint64(phnum)*uint64(phentsize) > uint64(len(head))-phoff {
		return 0, nil, false
	}
	progs := make([]*elf.Prog, phnum)
	for i := range progs {
		ph := head[phoff+uint64(i*phentsize):]
		progs[i] = &elf.Prog{ProgHeader: elf.ProgHeader{
			Type: elf.ProgType(le.Uint32(ph)), Flags: elf.ProgFlag(le.Uint32(ph[4:])),
			Off: le.Uint64(ph[8:]), Vaddr: le.Uint64(ph[16:]), Paddr: le.Uint64(ph[24:]),
			Filesz: le.Uint64(ph[32:]), Memsz: le.Uint64(ph[40:]), Align: le.Uint64(ph[48:]),
		}}
		if int64(progs[i].Off) < 0 || int64(progs[i].Filesz) < 0 {
			return 0, nil, false // debug/elf refuses these
		}
	}
	return typ, progs, true
}

// loadBias computes the bias from each executable mapping: the mapping at
// file offset O starting at S belongs to the PT_LOAD p with
// p.Off&^(page-1) <= O < p.Off+p.Filesz, and S = p.Vaddr - (p.Off - O) + bias.
// Every executable mapping must agree.
func loadBias(typ elf.Type, progs []*elf.Prog, ms []Mapping) (uint64, error) {
	const pageMask = 4096 - 1
	found := false
	var bias uint64
	for _, m := range ms {
		if !m.Exec() {
			continue
		}
		var seg *elf.Prog
		for _, p := range progs {
			if p.Type == elf.PT_LOAD && p.Flags&elf.PF_X != 0 && p.Off&^pageMask <= m.Offset && m.Offset < p.Off+p.Filesz {
				seg = p
				break
			}
		}
		if seg == nil {
			return 0, fmt.Errorf("executable mapping %x-%x at offset %#x matches no executable PT_LOAD", m.Start, m.End, m.Offset)
		}
		b := m.Start - seg.Vaddr + seg.Off - m.Offset
		if found && b != bias {
			return 0, fmt.Errorf("executable mappings disagree on the load bias (%#x vs %#x)", bias, b)
		}
		bias, found = b, true
	}
	if !found {
		return 0, fmt.Errorf("no executable mapping")
	}
	if typ == elf.ET_EXEC && bias != 0 {
		return 0, fmt.Errorf("ET_EXEC object loaded with bias %#x", bias)
	}
	return bias, nil
}

// buildID returns the GNU build-id from the PT_NOTE segments (present even in
// stripped objects), or "".
func buildID(f io.ReaderAt, progs []*elf.Prog, order binary.ByteOrder) string {
	for _, p := range progs {
		if p.Type != elf.PT_NOTE {
			continue
		}
		data, err := io.ReadAll(io.LimitReader(io.NewSectionReader(f, int64(p.Off), int64(p.Filesz)), 1<<20))
		if err != nil {
			continue
		}
		if id := elfnote.BuildID(data, order); id != "" {
			return id
		}
	}
	return ""
}
