package elfscan

import (
	"bytes"
	"debug/elf"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
)

// Options control a scan.
type Options struct {
	// Placeholder is the inert style for active sites:
	// probelist.PlaceholderFlip (the default when empty) or
	// probelist.PlaceholderNop.
	Placeholder string
}

// Report is what the scan saw besides the probe list.
type Report struct {
	Sites          []SiteState   // one per probe, in the probe list's order
	Skipped        []Skipped     // hook references that are not patchable sites
	DecodeErrors   []DecodeError // functions (or PLT sections) whose decode stopped early
	Functions      int           // functions decoded
	TextBytes      int64         // bytes of code decoded
	FunctionSource string        // where the function ranges came from: "symtab", "dynsym", "eh_frame", joined by "+"
	// McountLoc cross-checks the fentry probes against the __mcount_loc
	// table gcc's -mrecord-mcount writes; nil when the object has none.
	McountLoc *McountLocCheck
}

// McountLocCheck compares the __mcount_loc table with the fentry sites the
// decode found. The decode is what the probe list trusts: a table entry with
// no probe is reported, never turned into one, and a probe the table does
// not list is kept and reported (a unit built without -mrecord-mcount has
// sites and no entries).
type McountLocCheck struct {
	Entries  int      // addresses in the table
	Matched  int      // entries that are fentry probes
	Zero     int      // entries holding 0: functions the linker discarded (--gc-sections)
	NotSites []uint64 // non-zero entries at which no fentry probe was found
	Unlisted []uint64 // fentry probes the table does not list
	Err      string   // the table could not be read; nothing was compared
}

// OK reports whether the table and the fentry probes agree.
func (c *McountLocCheck) OK() bool {
	return c == nil || c.Err == "" && len(c.NotSites) == 0 && len(c.Unlisted) == 0
}

// SiteState says in which form a probe's site was found.
type SiteState struct {
	Address uint64
	State   string // "active" or "inert" (found already inert)
	// NopReason says why the nop placeholder was used for a call site
	// although flip was requested; empty otherwise.
	NopReason string
}

// Skipped is a reference to a hook that is not a patchable site, or bytes
// that look like an inert site but cannot be trusted to be one.
type Skipped struct {
	Address     uint64
	Container   string
	Instruction string
	Hook        string
	Reason      string
}

// DecodeError is a function whose linear decode stopped early. Its sites up
// to that point are kept; their hook arguments are not recovered, since
// branches from the undecoded rest could reach them.
type DecodeError struct {
	Function string
	Address  uint64
	Err      string
}

// Scan reads the ELF object at path and returns its probe list. Active sites
// get inert forms in opts' placeholder style; sites found already inert keep
// the flip form they are in. Errors wrap ErrNotELF, ErrNotX86_64,
// ErrTruncated, ErrMalformed, ErrUnsupported or ErrNoHookSites; with
// ErrNoHookSites the report is returned too.
func Scan(path string, opts Options) (*probelist.List, *Report, error) {
	f, err := os.Open(path)
	if err != nil {
		return nil, nil, err
	}
	defer f.Close()
	st, err := f.Stat()
	if err != nil {
		return nil, nil, err
	}
	return ScanReader(f, st.Size(), path, opts)
}

// ScanReader is Scan on size bytes read from r; path names the object in the
// probe list and in errors.
func ScanReader(r io.ReaderAt, size int64, path string, opts Options) (*probelist.List, *Report, error) {
	path, placeholder, err := prepare(path, opts)
	if err != nil {
		return nil, nil, err
	}
	if size < 0 {
		return nil, nil, &Error{Path: path, Kind: ErrTruncated, Detail: fmt.Sprintf("size %d", size)}
	}
	// What the headers describe, not a tail nothing uses (elfsafe.Extent).
	n, err := elfsafe.Extent(r, size)
	if err != nil {
		return nil, nil, &Error{Path: path, Kind: ErrMalformed, Detail: err.Error()}
	}
	data := make([]byte, n)
	if n, err := r.ReadAt(data, 0); n < len(data) {
		if errors.Is(err, io.EOF) {
			return nil, nil, &Error{Path: path, Where: atOffset(uint64(n)), Kind: ErrTruncated, Detail: "file ends early"}
		}
		return nil, nil, fmt.Errorf("%s: %w", path, err)
	}
	return scanBytes(data, path, placeholder)
}

// ScanBytes is ScanReader on an object already read (data is not copied;
// it must not change while the result is used).
func ScanBytes(data []byte, path string, opts Options) (*probelist.List, *Report, error) {
	path, placeholder, err := prepare(path, opts)
	if err != nil {
		return nil, nil, err
	}
	return scanBytes(data, path, placeholder)
}

// prepare checks opts' placeholder (flip by default) and makes path absolute
// (kept as given when it cannot be).
func prepare(path string, opts Options) (absPath, placeholder string, err error) {
	placeholder = opts.Placeholder
	if placeholder == "" {
		placeholder = probelist.PlaceholderFlip
	}
	if placeholder != probelist.PlaceholderFlip && placeholder != probelist.PlaceholderNop {
		return "", "", fmt.Errorf("elfscan: unknown placeholder %q", opts.Placeholder)
	}
	if abs, err := filepath.Abs(path); err == nil {
		path = abs
	}
	return path, placeholder, nil
}

func scanBytes(data []byte, path, placeholder string) (*probelist.List, *Report, error) {
	o, err := load(data, path)
	if err != nil {
		return nil, nil, err
	}
	return o.scan(placeholder)
}

func (o *object) scan(placeholder string) (*probelist.List, *Report, error) {
	rep := &Report{DecodeErrors: o.problems}
	fns, source := o.functions()
	rep.FunctionSource = source
	if o.ehErr != nil {
		if source == "eh_frame" || source == "" {
			return nil, nil, o.fail(ErrMalformed, "", "%v", o.ehErr)
		}
		rep.DecodeErrors = append(rep.DecodeErrors, DecodeError{Function: ".eh_frame", Err: o.ehErr.Error()})
	}
	type found struct {
		site
		fn *function
	}
	sites := make([]found, 0, len(fns)*2) // most functions have an entry and an exit site
	for i := range fns {
		fn := &fns[i]
		fa, derr := o.analyze(*fn)
		rep.Functions++
		rep.TextBytes += int64(fn.end - fn.start)
		if derr != nil {
			rep.DecodeErrors = append(rep.DecodeErrors, *derr)
		}
		rep.Skipped = append(rep.Skipped, fa.skipped...)
		for _, s := range fa.sites {
			sites = append(sites, found{s, fn})
		}
	}
	// Nested or overlapping function ranges decode the same bytes twice:
	// keep one copy of a site, and refuse sites the decodes disagree on.
	sort.SliceStable(sites, func(i, j int) bool { return sites[i].addr < sites[j].addr })
	kept := make([]found, 0, len(sites))
	for i := 0; i < len(sites); i++ {
		s := sites[i]
		if len(kept) > 0 && kept[len(kept)-1].addr == s.addr && kept[len(kept)-1].enc == s.enc {
			if s.fn.start > kept[len(kept)-1].fn.start { // the innermost range names the container
				kept[len(kept)-1] = s
			}
			continue
		}
		if len(kept) > 0 {
			p := kept[len(kept)-1]
			if s.addr < p.addr+uint64(len(p.cur)) {
				kept = kept[:len(kept)-1]
				for _, x := range []found{p, s} {
					rep.Skipped = append(rep.Skipped, Skipped{Address: x.addr, Container: x.fn.name, Instruction: fmt.Sprintf("% x", x.cur),
						Hook: x.hook.hook, Reason: "overlapping function ranges decode this site differently"})
				}
				continue
			}
		}
		kept = append(kept, s)
	}
	sort.SliceStable(rep.Skipped, func(i, j int) bool { return rep.Skipped[i].Address < rep.Skipped[j].Address })
	if len(kept) == 0 && len(rep.Skipped) == 0 {
		return nil, rep, o.fail(ErrNoHookSites, "", "decoded %d functions (%d bytes, from %s) and found no call or jump to %s, %s, %s or %s",
			rep.Functions, rep.TextBytes, orNone(source), hookEnter, hookExit, hookEnterBare, hookFentry)
	}

	di := o.readDebugInfo()
	list := &probelist.List{
		Format:  probelist.Format,
		Version: probelist.Version,
		Binary: probelist.Binary{
			Path:    o.path,
			BuildID: o.buildID(),
			Size:    int64(len(o.data)),
			Type:    map[elf.Type]string{elf.ET_EXEC: "exec", elf.ET_DYN: "dyn"}[o.f.Type],
		},
		Placeholder: placeholder,
		Probes:      make([]probelist.Probe, 0, len(kept)),
	}
	if o.f.Type == elf.ET_DYN {
		if s, err := o.f.DynString(elf.DT_SONAME); err == nil && len(s) > 0 {
			list.Binary.Soname = s[0]
		}
	}
	rep.Sites = make([]SiteState, 0, len(kept))
	for _, s := range kept {
		if s.hook.provider() == probelist.ProviderFentry {
			start, ok := o.entryOf(s.addr, len(s.cur))
			if !ok {
				what := "call to __fentry__"
				if s.inert {
					what = "inert-looking call to __fentry__"
				}
				rep.Skipped = append(rep.Skipped, Skipped{Address: s.addr, Container: s.fn.name, Instruction: fmt.Sprintf("% x", s.cur), Hook: s.hook.hook,
					Reason: what + " that is not a function's entry instruction (first, after endbr64, or inside push/pop %r10): not an fentry site"})
				continue
			}
			s.fnAddr, s.resolved = start, true
		}
		if s.nopReason == "" {
			s.nopReason = di.nopRule(s.site)
		}
		if s.inert && s.nopReason != "" {
			rep.Skipped = append(rep.Skipped, Skipped{Address: s.addr, Container: s.fn.name, Instruction: fmt.Sprintf("% x", s.cur), Hook: s.hook.hook,
				Reason: "found in flip-inert form, but " + s.nopReason + ": no scan would have flipped it"})
			continue
		}
		p, state, err := o.probe(s.site, s.fn, placeholder, di)
		if err != nil {
			return nil, nil, err
		}
		p.ID = len(list.Probes)
		list.Probes = append(list.Probes, p)
		rep.Sites = append(rep.Sites, state)
	}
	sort.SliceStable(rep.Skipped, func(i, j int) bool { return rep.Skipped[i].Address < rep.Skipped[j].Address })
	rep.McountLoc = o.checkMcountLoc(list)
	if err := list.Validate(); err != nil {
		return nil, nil, o.fail(ErrMalformed, "", "probe list: %v", err)
	}
	return list, rep, nil
}

// entryOf returns the start of the function whose entry instruction is the
// call at addr, of n bytes: a function starting at addr, or one starting with
// endbr64 just before it. Those are the places -mfentry puts the call, and a
// third: gcc brackets it with push/pop %r10 in nested functions, whose
// static chain arrives in r10, which a call may clobber.
func (o *object) entryOf(addr uint64, n int) (uint64, bool) {
	at := func(a uint64, want []byte) bool {
		b, _, ok := o.bytesAt(a, uint64(len(want)), true)
		return ok && bytes.Equal(b, want)
	}
	start := addr
	if addr >= 2 && at(addr-2, pushR10) && at(addr+uint64(n), popR10) {
		start = addr - 2
	}
	if o.funcStarts[start] {
		return start, true
	}
	if start >= 4 && o.funcStarts[start-4] && at(start-4, endbr64) {
		return start - 4, true
	}
	return 0, false
}

var (
	endbr64 = []byte{0xf3, 0x0f, 0x1e, 0xfa}
	pushR10 = []byte{0x41, 0x52}
	popR10  = []byte{0x41, 0x5a}
)

func orNone(s string) string {
	if s == "" {
		return "no function table"
	}
	return s
}

// probe turns a site into its probe-list entry.
func (o *object) probe(s site, fn *function, placeholder string, di *debugInfo) (probelist.Probe, SiteState, error) {
	p := probelist.Probe{
		Kind:      probelist.KindEntry,
		Provider:  s.hook.provider(),
		Container: fn.name,
		Hook:      s.hook.hook,
		Address:   probelist.Hex(s.addr),
		Encoding:  s.enc,
		Straddle:  probelist.Straddle(s.addr, len(s.cur)),
	}
	if s.hook.hook == hookExit {
		p.Kind = probelist.KindExit
	}
	p.Function, p.Resolved = fn.name, s.resolved
	if s.resolved {
		p.Function, p.FunctionAddress = o.nameOf(s.fnAddr), probelist.Hex(s.fnAddr)
	}
	if p.Provider == probelist.ProviderFentry {
		// The entry of the container: name the container the same way.
		p.Container = p.Function
	}
	_, off, _ := o.bytesAt(s.addr, 1, true)
	p.Offset = probelist.Hex(off)
	state := SiteState{Address: s.addr, State: "active"}
	if di != nil {
		p.Source = di.source(s.addr)
	}
	if s.inert {
		active, ok := probelist.ActiveFromFlip(s.enc, s.cur)
		if !ok {
			return p, state, o.fail(ErrMalformed, fmt.Sprintf("address %#x", s.addr), "inert %s site % x has no active form", s.enc, s.cur)
		}
		p.Active, p.Inert, p.Placeholder = active, append(probelist.Bytes(nil), s.cur...), probelist.PlaceholderFlip
		state.State = "inert"
		return p, state, nil
	}
	p.Active = append(probelist.Bytes(nil), s.cur...)
	p.Placeholder = placeholder
	if placeholder == probelist.PlaceholderFlip && isCallEncoding(s.enc) {
		if s.nopReason != "" {
			p.Placeholder = probelist.PlaceholderNop
			state.NopReason = s.nopReason
		}
	}
	inert, err := probelist.InertForm(s.enc, p.Active, p.Placeholder)
	if err != nil {
		return p, state, o.fail(ErrMalformed, fmt.Sprintf("address %#x", s.addr), "%v", err)
	}
	p.Inert = inert
	return p, state, nil
}

// nopRule applies what DWARF says about a call site reaching a hook defined
// in the object: a compiler that saw the hook's body (same unit, or LTO) may
// keep flags live across the call in ways the forward decode cannot see.
func (di *debugInfo) nopRule(s site) string {
	// -mfentry's call is emitted as text in the prologue, not as a call the
	// register allocator sees, and the flags are dead at a function's entry
	// whatever the compiler knew about __fentry__.
	if di == nil || !s.hook.direct || !isCallEncoding(s.enc) || s.hook.provider() == probelist.ProviderFentry {
		return ""
	}
	if di.lto {
		return "the object was built with LTO, which can keep flags live across a call to a hook it defines"
	}
	if u := di.unit(s.addr); u >= 0 && u == di.unit(s.hook.hookAddr) {
		return "the hook is defined in the same compilation unit, so the compiler may keep flags live across the call"
	}
	return ""
}

func isCallEncoding(enc string) bool {
	return enc == probelist.EncCallRel32 || enc == probelist.EncCallGOT || enc == probelist.EncAddr32Call
}
