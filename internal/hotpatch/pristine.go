package hotpatch

import (
	"bytes"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"slices"
	"strconv"

	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// spanMin is the batch size from which a flip batch reads the process's
// maps and the targets' files to write runs of sites as spans: below it,
// one byte per site costs less than that set-up.
const spanMin = 16

// pristine vouches for the text of the session's targets (xmod.Pristine):
// a span may be rewritten whole only in a private, file-backed mapping that
// is r-x (never writable) when the batch starts, where memory equals the
// object's file except inside the object's known probe sites, each in one
// of its two forms. docs/protocols.md gives the argument.
type pristine struct {
	pid   int
	maps  []span // the targets' r-xp mappings, as /proc/PID/maps says at the batch's start
	files map[*Target]*os.File
	// scratch holds the file's bytes of one span (Check).
	scratch []byte
	// id names maps (Identity): the mappings, where, of which files.
	id string
}

type span struct {
	m procmaps.Mapping
	t *Target
}

func newPristine(pid int, targets []*Target) (*pristine, error) {
	// Only r-xp file mappings may hold a span: one ioctl per executable
	// file mapping, not the whole maps text (D62).
	ms, err := procmaps.ExecFiles(pid)
	if err != nil {
		return nil, err
	}
	p := &pristine{pid: pid, files: map[*Target]*os.File{}}
	for _, m := range ms {
		if m.Perms != "r-xp" || m.Inode == 0 || m.Path == "" {
			continue
		}
		for _, t := range targets {
			if t.Object.Dev == m.Dev && t.Object.Inode == m.Inode {
				p.maps = append(p.maps, span{m, t})
				break
			}
		}
	}
	var b []byte
	for _, s := range p.maps {
		b = strconv.AppendUint(b, s.m.Start, 16)
		b = append(b, '-')
		b = strconv.AppendUint(b, s.m.End, 16)
		b = append(b, ' ')
		b = append(b, s.m.Perms...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, s.m.Offset, 16)
		b = append(b, ' ')
		b = append(b, s.m.Dev...)
		b = append(b, ' ')
		b = strconv.AppendUint(b, s.m.Inode, 10)
		b = append(b, '\n')
	}
	p.id = string(b)
	return p, nil
}

// Identity implements xmod.PristineIdentity: the span-writable mappings as
// the batch's start found them (address range, permissions, file offset,
// device and inode). A prepared selection keeps the images of its checked
// spans only while this stays the same (D61).
func (p *pristine) Identity() string { return p.id }

func (p *pristine) find(addr uint64) (span, bool) {
	for _, s := range p.maps {
		if addr >= s.m.Start && addr < s.m.End {
			return s, true
		}
	}
	return span{}, false
}

// Extent implements xmod.Pristine.
func (p *pristine) Extent(addr uint64) (uint64, bool) {
	s, ok := p.find(addr)
	return s.m.End, ok
}

// Check implements xmod.Pristine: cur must be the file's bytes but inside
// probe sites, each whole in cur and in one of its forms: the batch's own
// (ours, sorted, checked by the caller) or, found in the target's list, any
// other. Each stretch between two of ours is compared whole first (one
// memequal), and byte by byte only when it differs: a 40,000-site text is
// a megabyte of such stretches per batch.
func (p *pristine) Check(addr uint64, cur []byte, ours []xmod.Extent) error {
	if cap(p.scratch) < len(cur) {
		p.scratch = make([]byte, len(cur))
	}
	file := p.scratch[:len(cur)]
	if err := p.File(addr, file); err != nil {
		return err
	}
	s, _ := p.find(addr)
	// The usual case first: with the batch's own sites' bytes put into the
	// file's copy, the span equals it whole (one memequal of the span).
	// The gaps keep the file's bytes, so a difference is then looked for
	// gap by gap.
	for _, o := range ours {
		if o.Addr < addr || o.Addr+uint64(o.Len) > addr+uint64(len(cur)) {
			return fmt.Errorf("site at %#x lies outside the span %#x-%#x", o.Addr, addr, addr+uint64(len(cur)))
		}
		off := o.Addr - addr
		if o.Len <= 8 && off+8 <= uint64(len(cur)) {
			// A site of up to 8 bytes: one masked word instead of a copy
			// call (40,000 of them per batch).
			m := ^uint64(0) >> (64 - 8*uint(o.Len))
			f, c := binary.LittleEndian.Uint64(file[off:]), binary.LittleEndian.Uint64(cur[off:])
			binary.LittleEndian.PutUint64(file[off:], f&^m|c&m)
			continue
		}
		copy(file[off:off+uint64(o.Len)], cur[off:off+uint64(o.Len)])
	}
	if bytes.Equal(cur, file) {
		return nil
	}
	k := 0
	for _, o := range ours {
		if gap := int(o.Addr - addr); k < gap {
			if err := p.checkGap(s, addr, cur, file, k, gap); err != nil {
				return err
			}
		}
		if e := int(o.Addr-addr) + o.Len; e > k {
			k = e
		}
	}
	if k < len(cur) {
		return p.checkGap(s, addr, cur, file, k, len(cur))
	}
	return nil
}

// File implements xmod.PristineFile: the file's bytes of a span in one of
// the r-x file mappings.
func (p *pristine) File(addr uint64, b []byte) error {
	s, ok := p.find(addr)
	if !ok || addr+uint64(len(b)) > s.m.End {
		return fmt.Errorf("%#x-%#x: not in one r-x file mapping", addr, addr+uint64(len(b)))
	}
	f, err := p.file(s.t)
	if err != nil {
		return err
	}
	if _, err := f.ReadAt(b, int64(s.m.Offset+(addr-s.m.Start))); err != nil {
		return fmt.Errorf("%s: reading its text: %v", s.t.Object.Path, err)
	}
	return nil
}

// checkGap checks cur[from:to], a stretch holding none of the batch's own
// sites: equal to the file, but at other probe sites in one of their forms.
func (p *pristine) checkGap(s span, addr uint64, cur, file []byte, from, to int) error {
	if bytes.Equal(cur[from:to], file[from:to]) {
		return nil
	}
	for k := from; k < to; k++ {
		if cur[k] == file[k] {
			continue
		}
		at := addr + uint64(k)
		pr, ok, err := s.t.List.Covering(at - s.t.Object.Bias)
		if err != nil || !ok {
			return fmt.Errorf("%#x in %s differs from the file (%#02x, file %#02x) outside any probe site", at, s.t.Object.Path, cur[k], file[k])
		}
		start := s.t.Object.Runtime(uint64(pr.Address))
		end := start + uint64(len(pr.Active))
		if start < addr || end > addr+uint64(len(cur)) {
			return fmt.Errorf("probe %d at %#x differs from the file and lies across the span's edge", pr.ID, start)
		}
		seen := cur[start-addr : end-addr]
		if !bytes.Equal(seen, pr.Active) && !bytes.Equal(seen, pr.Inert) {
			return fmt.Errorf("probe %d at %#x holds % x, neither of its forms", pr.ID, start, seen)
		}
		k = int(end-addr) - 1
	}
	return nil
}

func (p *pristine) file(t *Target) (*os.File, error) {
	if f := p.files[t]; f != nil {
		return f, nil
	}
	f, err := procmaps.Open(p.pid, t.Object)
	if err != nil {
		return nil, err
	}
	p.files[t] = f
	return f, nil
}

// changed reports the span-written mappings whose permissions or extent
// /proc/PID/maps no longer shows as they were at the batch's start: a
// writer in the target (mprotect to make the text writable) at work.
func (p *pristine) changed() []string {
	ms, err := procmaps.ExecFiles(p.pid) // a span mapping made non-executable is then missing: reported
	if err != nil {
		return nil
	}
	var out []string
	for _, s := range p.maps {
		found := false
		for _, m := range ms {
			if m.Start == s.m.Start && m.End == s.m.End && m.Perms == s.m.Perms && m.Inode == s.m.Inode {
				found = true
				break
			}
		}
		if !found {
			out = append(out, fmt.Sprintf("mapping %#x-%#x of %s changed during the batch", s.m.Start, s.m.End, s.t.Object.Path))
		}
	}
	return out
}

func (p *pristine) close() {
	for _, f := range p.files {
		f.Close()
	}
}

// reader is what the session reads sites through: its own /proc/PID/mem
// descriptor, so that a read is one pread, not a hand-off to the tracer
// thread (reading r-x text needs no FOLL_FORCE, so no tracer either).
// Writes stay on the tracer thread, where kernels booted with
// proc_mem.force_override=ptrace require them.
func (s *Session) reader() xmod.Mem {
	if s.mem == nil {
		m, err := ptrace.OpenMem(s.pid)
		if err != nil {
			return s.tracer
		}
		s.mem = m
	}
	return s.mem
}

// flip writes a flip batch on the tracer's thread; a batch of spanMin
// sites or more gets a pristine, so runs of sites in untouched text are
// written as checked spans (xmod.FlipOptions.Pristine).
func (s *Session) flip(ctx context.Context, changes []xmod.Change, res *Result) (xmod.Result, error) {
	if len(changes) < spanMin || s.noSpans {
		return xmod.Flip(ctx, s.writer(), changes, xmod.FlipOptions{})
	}
	pr, err := newPristine(s.pid, s.targets)
	if err != nil {
		return xmod.Flip(ctx, s.writer(), changes, xmod.FlipOptions{})
	}
	defer pr.close()
	st := &xmod.SpanStats{}
	r, err := xmod.Flip(ctx, s.writer(), changes, xmod.FlipOptions{Pristine: pr, Stats: st})
	res.Spans = st
	for _, w := range st.Raced {
		res.Warnings = append(res.Warnings, "a writer in the target shares a page written: "+w+"; the rest of the batch was written one byte per site")
	}
	res.Warnings = append(res.Warnings, pr.changed()...)
	return r, err
}

// flipPrepared is flip for a prepared flip-only selection whose states
// Apply has just read: the batch is not read again before it is written
// (D46); spans re-read and check each run right before writing it.
func (s *Session) flipPrepared(ctx context.Context, p *prepared, states []xmod.State, res *Result) (xmod.Result, error) {
	if p.batch.Len() < spanMin || s.noSpans {
		return p.batch.Flip(ctx, s.writer(), states, xmod.FlipOptions{})
	}
	pr, err := newPristine(s.pid, s.targets)
	if err != nil {
		return p.batch.Flip(ctx, s.writer(), states, xmod.FlipOptions{})
	}
	defer pr.close()
	st := &xmod.SpanStats{}
	if s.spanScratch == nil {
		s.spanScratch = make([]byte, 3*(xmod.DefaultMaxSpan+16))
	}
	pr.scratch = s.fileScratch
	r, err := p.batch.Flip(ctx, s.writer(), states, xmod.FlipOptions{Pristine: pr, Stats: st, Scratch: s.spanScratch})
	s.fileScratch = pr.scratch
	res.Spans = st
	for _, w := range st.Raced {
		res.Warnings = append(res.Warnings, "a writer in the target shares a page written: "+w+"; the rest of the batch was written one byte per site")
	}
	res.Warnings = append(res.Warnings, pr.changed()...)
	return r, err
}

// maxImageBytes bounds the memory a session's prepared selections hold in
// span images (xmod.Prepared.ImageBytes): two copies of the text their
// spans cover, 2.2 MB for the 40,000-probe benchmark program.
const maxImageBytes = 64 << 20

// boundImages keeps the images (xmod.Prepared.KeepImages) of the
// selections applied most recently within maxImageBytes, p's always.
func (s *Session) boundImages(p *prepared) {
	if p.batch.ImageBytes() == 0 {
		return
	}
	// Most recent last.
	if i := slices.Index(s.imaged, p); i >= 0 {
		s.imaged = slices.Delete(s.imaged, i, i+1)
	}
	s.imaged = append(s.imaged, p)
	total := 0
	for _, q := range s.imaged {
		total += q.batch.ImageBytes()
	}
	for total > maxImageBytes && len(s.imaged) > 1 {
		total -= s.imaged[0].batch.ImageBytes()
		s.imaged[0].batch.DropImages()
		s.imaged = s.imaged[1:]
	}
}

// DropImages forgets what every prepared selection keeps of its last reads
// and writes (xmod.Prepared.KeepImages, D61): the next Apply of each is
// as its first, the way one hotpatch call applies its selection (the
// benchmarks' first-batch rows).
func (s *Session) DropImages() {
	for _, p := range s.prepared {
		p.batch.DropImages()
	}
	s.imaged = nil
}

// DropImagesOf is DropImages for the selection of actions under protocol
// alone (as Apply names it; "" is auto), when it was prepared: a
// benchmark alternating a selection's first batch with another
// selection's toggled ones on one session.
func (s *Session) DropImagesOf(actions []Action, protocol string) {
	if protocol == "" {
		protocol = ProtoAuto
	}
	p := s.prepared[string(s.key(actions, protocol))]
	if p == nil {
		return
	}
	p.batch.DropImages()
	if i := slices.Index(s.imaged, p); i >= 0 {
		s.imaged = slices.Delete(s.imaged, i, i+1)
	}
}

// SetSpanWrites turns checked span writes for large flip batches off (every
// site written alone: the reference the benchmarks compare with) or on
// (the default).
func (s *Session) SetSpanWrites(on bool) { s.noSpans = !on }

// NewPristine is the xmod.Pristine a session's flip batches use, for
// callers of xmod.Flip (benchmarks); done closes the files it opened.
func NewPristine(pid int, targets []*Target) (pr xmod.Pristine, done func(), err error) {
	p, err := newPristine(pid, targets)
	if err != nil {
		return nil, nil, err
	}
	return p, p.close, nil
}
