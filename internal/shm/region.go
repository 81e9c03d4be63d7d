package shm

import (
	"errors"
	"fmt"
	"math/bits"
	"os"
	"sync/atomic"
	"syscall"
	"unsafe"

	"golang.org/x/sys/unix"

	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// MemfdName is how /proc/PID/fd shows the runtime's region: an anonymous
// memory file (memfd_create "edgeprobe"), which nobody else can name, plant
// or truncate, and which the kernel frees with the process (decision D16).
const MemfdName = "/memfd:edgeprobe"

// Region is an open region: a live process's mapping or an output file.
type Region struct {
	path     string
	mem      []byte
	hdr      Header // validated copy of the immutable geometry
	writable bool
	dataBuf  []uint64 // Consume's payload buffer for EvData records
	file     *os.File // the region's file, for data's questions (nil: none)
	lock     *os.File // our own open file of it, flocked by TryLock (nil: none)
	// stamps: per slot, the generation of the last DataGen record Consume
	// met in its ring (D79); a slot not in it has had none read yet.
	stamps map[int]uint32
}

// Errors of OpenPID; test with errors.Is. ErrNoRuntime also matches
// os.ErrNotExist.
var (
	ErrNoRuntime = errors.New("no edgeprobe runtime region in the process")
	ErrUntrusted = errors.New("region not trusted")
	// ErrOverflow: a sum hotpatch forms of the region's counters (a
	// function's shared counts plus its thread-cache counts, the histogram's
	// buckets, the per-thread counters) passed 2^64, or a count went down
	// between two reads. Counting real calls cannot do either (2^64 ns is
	// 584 years of summed latency; the counters only grow), so the counts
	// were written by something other than the runtime: the program itself,
	// or a corruption (D92).
	ErrOverflow = errors.New("counters wrap (a sum passed 2^64, or a count went down)")
)

// addSat is a+b held at 2^64-1 instead of wrapping; it appends what to
// *over when it overflows (D92: every sum of counters is checked, none
// wraps into a small, plausible number).
func addSat(a, b uint64, over *[]string, what string) uint64 {
	s, c := bits.Add64(a, b, 0)
	if c == 0 {
		return s
	}
	for _, w := range *over {
		if w == what {
			return ^uint64(0)
		}
	}
	*over = append(*over, what)
	return ^uint64(0)
}

// OpenPID opens the live region of process pid: the runtime's memfd, found
// among the process's descriptors (/proc/PID/fd, which needs the rights of
// ptrace: the same user, or CAP_SYS_PTRACE) and taken as the process's own
// open file, never reopened by path (takeFD, D86). It is trusted only if
// the file belongs to the process's owner and its header names pid as the
// process sees itself (its pid namespace's number; a fork child's inherited
// descriptor would name the parent).
func OpenPID(pid int) (*Region, error) {
	if pid <= 0 {
		return nil, fmt.Errorf("shm: pid %d: %w", pid, ErrNoRuntime)
	}
	var st syscall.Stat_t
	if err := syscall.Stat(fmt.Sprintf("/proc/%d", pid), &st); err != nil {
		return nil, fmt.Errorf("shm: pid %d: no such process: %w (%w)", pid, ErrNoRuntime, os.ErrNotExist)
	}
	owner := st.Uid
	var r *Region
	var firstErr error
	err := regionFiles(pid, func(f *os.File, fd int, err error) bool {
		if err == nil {
			r, err = openTrusted(f, pid, owner)
			if err == nil {
				return true
			}
		} else {
			err = fmt.Errorf("shm: pid %d: descriptor %d: %w", pid, fd, err)
		}
		if firstErr == nil {
			firstErr = err
		}
		return false
	})
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return nil, fmt.Errorf("shm: pid %d: no such process: %w (%w)", pid, ErrNoRuntime, os.ErrNotExist)
		}
		return nil, fmt.Errorf("shm: pid %d: listing its descriptors needs ptrace rights (same user or CAP_SYS_PTRACE): %w", pid, err)
	}
	if r != nil {
		return r, nil
	}
	if firstErr != nil {
		return nil, firstErr
	}
	return nil, fmt.Errorf("shm: pid %d: %w (%w)", pid, ErrNoRuntime, os.ErrNotExist)
}

// openTrusted maps f, a candidate region taken from process pid (takeFD:
// a memfd of the runtime's name), after checking who owns it and that it
// cannot shrink, and checks whom its header describes before trusting any
// other byte. It is mapped read-write when the process opened it so (the
// runtime does), else read-only.
func openTrusted(f *os.File, pid int, owner uint32) (*Region, error) {
	var st syscall.Stat_t
	if err := syscall.Fstat(int(f.Fd()), &st); err != nil {
		return nil, fmt.Errorf("shm: pid %d: %w", pid, err)
	}
	if st.Uid != owner {
		return nil, fmt.Errorf("shm: pid %d: its %s is owned by uid %d, the process by uid %d: %w", pid, MemfdName, st.Uid, owner, ErrUntrusted)
	}
	if err := checkSealed(int(f.Fd())); err != nil {
		return nil, fmt.Errorf("shm: pid %d: its %s %w: %w", pid, MemfdName, err, ErrUntrusted)
	}
	fl, err := unix.FcntlInt(f.Fd(), unix.F_GETFL, 0)
	if err != nil {
		return nil, fmt.Errorf("shm: pid %d: %w", pid, err)
	}
	r, err := mapFile(f, f.Name(), fl&unix.O_ACCMODE == unix.O_RDWR)
	if err != nil {
		return nil, fmt.Errorf("shm: pid %d: %w: %w", pid, ErrUntrusted, err)
	}
	// The runtime records getpid(): in another pid namespace, the pid there.
	if got, want := int(r.hdr.Pid), procfs.InnerPid(pid); got != want {
		r.Close()
		return nil, fmt.Errorf("shm: pid %d: its %s describes pid %d: %w", pid, MemfdName, got, ErrUntrusted)
	}
	return r, nil
}

// checkSealed refuses a region file that may shrink under a mapping of it:
// a read of a page past its new end is a SIGBUS, which kills the reader
// (review5: a program that truncated its own region made `hotpatch trace`
// die with "fatal error: fault"). The runtime seals its memfd against
// shrinking (and its seals against change) right after sizing it.
func checkSealed(fd int) error {
	seals, err := unix.FcntlInt(uintptr(fd), unix.F_GET_SEALS, 0)
	if err != nil {
		return fmt.Errorf("has no seals (%v): a runtime older than this hotpatch, or not a region", err)
	}
	if seals&unix.F_SEAL_SHRINK == 0 {
		return errors.New("is not sealed against shrinking: a runtime older than this hotpatch, or not a region")
	}
	return nil
}

// Open maps the region file at path, read-write when permitted (needed for
// SetControl and Consume), else read-only, and validates its header.
//
// Only a regular file is opened (procfs.OpenRegularFile): the file may be
// another user's output, and a FIFO or a link to a device put in its place
// must not be opened by root's hotpatch (D88).
func Open(path string) (*Region, error) {
	f, err := procfs.OpenRegularFile(path, os.O_RDWR)
	writable := err == nil
	if err != nil && !errors.Is(err, procfs.ErrNotRegular) {
		f, err = procfs.OpenRegularFile(path, os.O_RDONLY)
	}
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	defer f.Close()
	return mapFile(f, path, writable)
}

// mapFile maps the open region file f and validates its header.
func mapFile(f *os.File, path string, writable bool) (*Region, error) {
	st, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("shm: %w", err)
	}
	size := st.Size()
	if size < HeaderSize {
		return nil, fmt.Errorf("shm: %s: %d bytes, need at least %d: %w", path, size, HeaderSize, ErrTruncated)
	}
	if int64(int(size)) != size {
		return nil, fmt.Errorf("shm: %s: %d bytes: %w", path, size, ErrLayout)
	}
	prot := syscall.PROT_READ
	if writable {
		prot |= syscall.PROT_WRITE
	}
	mem, err := syscall.Mmap(int(f.Fd()), 0, int(size), prot, syscall.MAP_SHARED)
	if err != nil {
		return nil, fmt.Errorf("shm: mmap %s: %w", path, err)
	}
	h, err := ParseHeader(mem)
	if err != nil {
		syscall.Munmap(mem)
		return nil, fmt.Errorf("shm: %s: %w", path, err)
	}
	return &Region{path: path, mem: mem, hdr: h, writable: writable, file: dupFile(f)}, nil
}

// Close unmaps the region.
func (r *Region) Close() error {
	if r.mem == nil {
		return nil
	}
	err := syscall.Munmap(r.mem)
	r.mem = nil
	if r.file != nil {
		r.file.Close()
		r.file = nil
	}
	if r.lock != nil {
		r.lock.Close()
		r.lock = nil
	}
	return err
}

// TryLock takes an exclusive flock of the region's file without waiting,
// held until Close: unix.EWOULDBLOCK when another open file of it holds
// one (another hotpatch, or the runtime's SIGTRAP handler looking, D101),
// ErrNoRuntime when the region has no file. The lock is on an open file of
// our own (the memfd opened again through /proc/self/fd): the region's
// descriptor is the program's own open file (pidfd_getfd), whose flock
// would be the runtime's too, and never conflict with its look.
func (r *Region) TryLock() error {
	if r.lock == nil {
		if r.file == nil {
			return fmt.Errorf("shm: %s: %w", r.path, ErrNoRuntime)
		}
		f, err := os.OpenFile(fmt.Sprintf("/proc/self/fd/%d", r.file.Fd()), os.O_RDONLY, 0)
		if err != nil {
			return fmt.Errorf("shm: %s: %w", r.path, err)
		}
		r.lock = f
	}
	for {
		err := unix.Flock(int(r.lock.Fd()), unix.LOCK_EX|unix.LOCK_NB)
		if err != unix.EINTR {
			return err
		}
	}
}

// Path is the file the region was opened from.
func (r *Region) Path() string { return r.path }

// Writable reports whether SetControl and Consume may be used.
func (r *Region) Writable() bool { return r.writable }

func (r *Region) u64(off uint64) uint64 {
	return atomic.LoadUint64((*uint64)(unsafe.Pointer(&r.mem[off])))
}

func (r *Region) u32(off uint64) uint32 {
	return atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.mem[off])))
}

var (
	hdrControl  = uint64(unsafe.Offsetof(Header{}.Control))
	hdrGen      = uint64(unsafe.Offsetof(Header{}.Gen))
	hdrQuotaK   = uint64(unsafe.Offsetof(Header{}.QuotaK))
	hdrQuotaE   = uint64(unsafe.Offsetof(Header{}.QuotaEpoch))
	hdrFDepth   = uint64(unsafe.Offsetof(Header{}.FilterDepth))
	hdrFTid     = uint64(unsafe.Offsetof(Header{}.FilterTid))
	hdrFMin     = uint64(unsafe.Offsetof(Header{}.FilterMinNs))
	hdrFEpoch   = uint64(unsafe.Offsetof(Header{}.FilterEpoch))
	hdrState    = uint64(unsafe.Offsetof(Header{}.State))
	hdrFuncSegs = uint64(unsafe.Offsetof(Header{}.FuncSegs))
)

// Header returns the header with its mutable fields (state, control,
// counters, exit time) read atomically now.
func (r *Region) Header() Header {
	h := r.hdr
	p := (*Header)(unsafe.Pointer(&r.mem[0]))
	h.State = atomic.LoadUint32(&p.State)
	h.Control = atomic.LoadUint32(&p.Control)
	h.RingReq = atomic.LoadUint32(&p.RingReq)
	h.ExitMono = atomic.LoadUint64(&p.ExitMono)
	h.ExitTSC = atomic.LoadUint64(&p.ExitTSC)
	h.FuncsUsed = atomic.LoadUint64(&p.FuncsUsed)
	h.FuncDropEnters = atomic.LoadUint64(&p.FuncDropEnters)
	h.FuncDropExits = atomic.LoadUint64(&p.FuncDropExits)
	h.ThreadsClaimed = atomic.LoadUint64(&p.ThreadsClaimed)
	h.ThreadsActive = atomic.LoadUint64(&p.ThreadsActive)
	h.ThreadOverflows = atomic.LoadUint64(&p.ThreadOverflows)
	h.ThreadDropHits = atomic.LoadUint64(&p.ThreadDropHits)
	h.PreinitDrops = atomic.LoadUint64(&p.PreinitDrops)
	h.LateDrops = atomic.LoadUint64(&p.LateDrops)
	h.FentryMode = atomic.LoadUint32(&p.FentryMode)
	h.FentrySites = atomic.LoadUint64(&p.FentrySites)
	h.FentryBadSites = atomic.LoadUint64(&p.FentryBadSites)
	h.FentryUnwound = atomic.LoadUint64(&p.FentryUnwound)
	h.Nosys = atomic.LoadUint32(&p.Nosys)
	h.NosysThreads = atomic.LoadUint64(&p.NosysThreads)
	h.NosysSkips = atomic.LoadUint64(&p.NosysSkips)
	h.FuncSegs = r.funcSegs()
	return h
}

// Exited reports whether the process ran its exit handler (always true for
// an EDGEPROBE_OUTPUT file).
func (r *Region) Exited() bool { return r.u32(hdrState) == StateExited }

// Maps is the copy of /proc/PID/maps an output file carries (nil for a live
// region: read /proc/PID/maps instead).
func (r *Region) Maps() []byte {
	if r.hdr.MapsLen == 0 {
		return nil
	}
	return append([]byte(nil), r.mem[r.hdr.MapsOff:r.hdr.MapsOff+r.hdr.MapsLen]...)
}

// Control returns the control bits.
func (r *Region) Control() uint32 { return r.u32(hdrControl) }

// SetControl sets the bits in set and clears those in clear, atomically with
// respect to other readers doing the same; hooks see the change at their next
// call.
func (r *Region) SetControl(set, clear uint32) error {
	if !r.writable {
		return fmt.Errorf("shm: %s: %w", r.path, ErrReadOnly)
	}
	p := (*uint32)(unsafe.Pointer(&r.mem[hdrControl]))
	for {
		old := atomic.LoadUint32(p)
		if atomic.CompareAndSwapUint32(p, old, old&^clear|set) {
			return nil
		}
	}
}

// NewGeneration starts a new generation of each function whose run-time
// address is in keys, so that exits stop matching shadow frames pushed
// before: call it just before turning a function's probes on. (While a
// function's probes were off, a call that had entered could leave without
// its exit being seen; its frame sits at the very depth where the next call
// of the function runs, and an exit of a call entered unseen would match it
// and record a latency spanning both.) Functions the runtime has not
// recorded have no frames and are skipped. It returns how many it bumped.
func (r *Region) NewGeneration(keys []uint64) (int, error) {
	if !r.writable {
		return 0, fmt.Errorf("shm: %s: %w", r.path, ErrReadOnly)
	}
	// One new value of the process-wide generation for all of them
	// (D29): a frame is stale when its function's generation is newer than
	// the one it was pushed in, and an exit whose frame was pushed in the
	// current one needs no look at the function (the hooks' fast path).
	// Only lookups that find the function take a value: a call that finds
	// none leaves the fast path alone.
	var gen uint32
	n := 0
	for _, key := range keys {
		if e := r.lookup(key); e != nil {
			if n == 0 {
				gen = atomic.AddUint32((*uint32)(unsafe.Pointer(&r.mem[hdrGen])), 1)
			}
			atomic.StoreUint64(&e.Gen, uint64(gen))
			n++
		}
	}
	return n, nil
}

// SetQuota sets the per-function quota: with CtlQuota on, each function
// records at most k calls per quota epoch, counted at the hook across all
// threads (D31). Set it before turning CtlQuota on.
func (r *Region) SetQuota(k uint32) error {
	if !r.writable {
		return fmt.Errorf("shm: %s: %w", r.path, ErrReadOnly)
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.mem[hdrQuotaK])), k)
	return nil
}

// NextQuotaEpoch starts a new quota epoch: every function may record its
// quota of calls again. It returns the new epoch.
func (r *Region) NextQuotaEpoch() (uint32, error) {
	if !r.writable {
		return 0, fmt.Errorf("shm: %s: %w", r.path, ErrReadOnly)
	}
	return atomic.AddUint32((*uint32)(unsafe.Pointer(&r.mem[hdrQuotaE])), 1), nil
}

// ErrFilter says a trace filter asks for more than the runtime can hold.
var ErrFilter = errors.New("trace filter")

// SetFilter sets the trace filters CtlFilter turns on (D32): events only of
// calls at shadow-stack depth below maxDepth (0: any), only of the threads
// in tids (none: every thread; at most FilterTids), and only of calls that
// lasted at least minNs (0: any; the calls' enter events are written at
// their exit). Set it before turning CtlFilter on; clear it
// (SetFilter(0, nil, 0)) after turning it off. Each call starts a new
// process-wide generation (Gen).
func (r *Region) SetFilter(maxDepth uint32, tids []int32, minNs uint32) error {
	if !r.writable {
		return fmt.Errorf("shm: %s: %w", r.path, ErrReadOnly)
	}
	if len(tids) > FilterTids {
		return fmt.Errorf("%w: %d threads, the runtime can filter on at most %d", ErrFilter, len(tids), FilterTids)
	}
	for _, t := range tids {
		if t <= 0 {
			return fmt.Errorf("%w: thread id %d", ErrFilter, t)
		}
	}
	for i := 0; i < FilterTids; i++ {
		var t int32
		if i < len(tids) {
			t = tids[i]
		}
		atomic.StoreInt32((*int32)(unsafe.Pointer(&r.mem[hdrFTid+uint64(4*i)])), t)
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.mem[hdrFDepth])), maxDepth)
	if minNs != 0 {
		// marks left on shadow frames by an earlier capture mean nothing now
		atomic.AddUint32((*uint32)(unsafe.Pointer(&r.mem[hdrFEpoch])), 1)
	}
	atomic.StoreUint32((*uint32)(unsafe.Pointer(&r.mem[hdrFMin])), minNs)
	// Last, a new process-wide generation: the verdict a thread keeps on
	// the filters is valid only under the control|gen word it was made
	// under (ep_thread.filter_cg, D58), so none made before this call
	// outlives the filters it set. (Live frames keep matching their
	// functions: only a function's own generation makes a frame stale.)
	atomic.AddUint32((*uint32)(unsafe.Pointer(&r.mem[hdrGen])), 1)
	return nil
}

// StartTrace turns on the control bits ctl (CtlTrace and what goes with
// it) in a process-wide generation of their own, which it returns: a hook
// stamps each event with the generation of the control|gen word it decided
// the event under (D79), so the events of this trace are those stamped
// with it or a later one, and an event a hook decided under an earlier
// trace's word, and wrote late, is told apart. Set the filters (SetFilter,
// CtlFilter) before: every word of the new generation has them.
func (r *Region) StartTrace(ctl uint32) (uint32, error) {
	if !r.writable {
		return 0, r.readOnly()
	}
	p := (*uint32)(unsafe.Pointer(&r.mem[hdrGen]))
	gen := atomic.AddUint32(p, 1)
	if gen == 0 {
		// a slot's stamp starts at 0 (none): events of a generation 0
		// would go unstamped, and be taken for older ones
		gen = atomic.AddUint32(p, 1)
	}
	if err := r.SetControl(ctl, 0); err != nil {
		return 0, err
	}
	return gen, nil
}

// QuotaEpoch is the current quota epoch.
func (r *Region) QuotaEpoch() uint32 { return r.u32(hdrQuotaE) }

// QuotaUsed returns the quota state of the function at key: the epoch of
// its last recorded call under quotas and how many calls it recorded in
// that epoch. ok is false when the runtime has not recorded the function.
func (r *Region) QuotaUsed(key uint64) (epoch, used uint32, ok bool) {
	e := r.lookup(key)
	if e == nil {
		return 0, 0, false
	}
	q := atomic.LoadUint64(&e.Quota)
	return uint32(q >> 32), uint32(q), true
}

// TicksToNs converts clock ticks of the runtime (TSC ticks, or ns under
// the monotonic clock) to ns.
func (r *Region) TicksToNs(ticks uint64) float64 {
	return float64(ticks) * float64(r.hdr.TSCMult) / (1 << 32)
}

// HookCost is the mean time inside the runtime's hooks sampled while quotas
// were on (one hook in 64 per thread, TSC), over every thread slot, and how
// many hooks were sampled; 0 samples when none was (no quotas yet, or no TSC)
// or when the sums overflow (ErrOverflow: not the runtime's numbers).
func (r *Region) HookCost() (ns float64, samples uint64) {
	var ticks uint64
	var over []string
	for _, t := range r.Threads() {
		ticks = addSat(ticks, t.HookTicks, &over, "hook_ticks")
		samples = addSat(samples, t.HookSamples, &over, "hook_samples")
	}
	if samples == 0 || len(over) > 0 { // not the runtime's numbers (D92): not measured
		return 0, 0
	}
	return r.TicksToNs(ticks) / float64(samples), samples
}

// lookup finds key's function entry the way the runtime's ep_gfind probes
// the table: MaxProbe slots from the key's home in each segment in use, in
// order; an empty slot on the way means the key was never claimed.
//
// A lookup reads only the windows of the key's probe sequence, and stops at
// an empty slot, so it touches a few pages of keys at most: it asks nothing
// of the file (see extents.go), which would cost more than the lookup.
func (r *Region) lookup(key uint64) *funcEntry { return r.lookupIn(extents{all: true}, key) }

// lookupIn is lookup with the region's data extents known (a page of keys
// that holds no data holds only empty slots).
func (r *Region) lookupIn(d extents, key uint64) *funcEntry {
	segs := r.funcSegs()
	h := key * hashMul
	base, n := uint64(0), uint64(r.hdr.FuncFirst)
	for seg := uint32(0); seg < segs; seg++ {
		if seg > 1 {
			n <<= 1
		}
		if seg > 0 {
			base = n
		}
		home := h >> 32
		for p := uint64(0); p < uint64(r.hdr.MaxProbe); p++ {
			i := base + (home+p)&(n-1)
			if !d.has(r.hdr.KeysOff+i*8, 8) {
				return nil
			}
			switch atomic.LoadUint64(r.keyAt(i)) {
			case key:
				return r.funcAt(i)
			case 0:
				return nil
			}
		}
		h = (h ^ h>>29) * hashStep
	}
	return nil
}

// funcSegs is the number of function-table segments in use now (the runtime
// only raises it), within what the geometry allows.
func (r *Region) funcSegs() uint32 {
	n := atomic.LoadUint32((*uint32)(unsafe.Pointer(&r.mem[hdrFuncSegs])))
	if max := r.hdr.funcSegsMax(); n > max {
		n = max
	}
	if n == 0 {
		n = 1
	}
	return n
}

// FuncSlots is the number of function-table slots in the segments in use
// now: the table's size, which grows with the functions recorded.
func (r *Region) FuncSlots() uint64 {
	return uint64(r.hdr.FuncFirst) << (r.funcSegs() - 1)
}

// SetTrace switches the event rings on or off.
func (r *Region) SetTrace(on bool) error {
	if on {
		return r.SetControl(CtlTrace, 0)
	}
	return r.SetControl(0, CtlTrace)
}

// Func is one function's totals.
type Func struct {
	Addr      uint64 // runtime address of the function (KeyBare cleared)
	Bare      bool   // recorded by __cyg_profile_func_enter_bare: Addr is inside the function
	Entries   uint64
	Exits     uint64 // including orphans
	Orphans   uint64 // exits with no enter on the thread's shadow stack
	Unmatched uint64 // enters whose frame was found dead without an exit (longjmp, exceptions, toggles)
	// DeepEntries are entries deeper than the shadow stack (counted, no
	// frame, untimed); DeepExits the exits matched to them by nesting.
	DeepEntries uint64
	DeepExits   uint64
	// Open counts the function's frames still on a thread's shadow stack
	// (calls in progress, or frames no later hook has found dead yet), and
	// those parked with a context suspended in swapcontext (D102).
	Open    uint64
	Samples uint64 // timed exits (sum of Hist)
	SumNs   uint64
	MinNs   uint64 // 0 when Samples == 0
	MaxNs   uint64
	Hist    [HistBuckets]uint64
	// Overflow names the sums (entries, exits, total_ns, samples) that
	// passed 2^64 when formed; each is held at 2^64-1. Non-empty means the
	// counts were not written by the runtime (ErrOverflow, D92): report
	// them as an error naming the function, never as numbers.
	Overflow []string
}

// Balanced reports whether every tracked entry is accounted for: once the
// process is quiet, each entry given a frame ended in exactly one of a
// matched exit, an unmatched frame, or a frame still open:
// Entries - DeepEntries == (Exits - Orphans - DeepExits) + Unmatched + Open.
//
// The equation is checked in integers, not modulo 2^64: counts that only
// balance by wrapping (DeepEntries above Entries, say) are not balanced.
func (f *Func) Balanced() bool {
	if len(f.Overflow) > 0 || f.DeepEntries > f.Entries {
		return false
	}
	out := f.Exits
	for _, d := range []uint64{f.Orphans, f.DeepExits} {
		if d > out {
			return false
		}
		out -= d
	}
	out, c1 := bits.Add64(out, f.Unmatched, 0)
	out, c2 := bits.Add64(out, f.Open, 0)
	return c1|c2 == 0 && f.Entries-f.DeepEntries == out
}

// MeanNs is the mean latency, 0 without samples.
func (f *Func) MeanNs() uint64 {
	if f.Samples == 0 {
		return 0
	}
	return f.SumNs / f.Samples
}

// Percentile estimates latency quantile q in [0,1] at bucket resolution.
func (f *Func) Percentile(q float64) uint64 { return Percentile(&f.Hist, q, f.MinNs, f.MaxNs) }

func (r *Region) keyAt(i uint64) *uint64 {
	return (*uint64)(unsafe.Pointer(&r.mem[r.hdr.KeysOff+i*8]))
}

func (r *Region) funcAt(i uint64) *funcEntry {
	return (*funcEntry)(unsafe.Pointer(&r.mem[r.hdr.FuncOff+i*funcSize]))
}

// slotUsed reports whether thread slot i has ever been claimed, without
// touching the page of a slot that never was (see extents.go).
func (r *Region) slotUsed(d extents, i uint64) bool {
	off := r.hdr.ThreadOff + i*uint64(r.hdr.ThreadSize)
	if !d.has(off, threadSize) {
		return false
	}
	return atomic.LoadUint32(&r.slotAt(i).Generation) != 0
}

func (r *Region) slotAt(i uint64) *threadSlot {
	return (*threadSlot)(unsafe.Pointer(&r.mem[r.hdr.ThreadOff+i*uint64(r.hdr.ThreadSize)]))
}

func (r *Region) frameAt(slot, i uint64) *frame {
	off := r.hdr.ThreadOff + slot*uint64(r.hdr.ThreadSize) + uint64(r.hdr.ThreadStackOff) + i*frameSize
	return (*frame)(unsafe.Pointer(&r.mem[off]))
}

func (r *Region) localAt(slot, i uint64) *localEntry {
	off := r.hdr.ThreadOff + slot*uint64(r.hdr.ThreadSize) + uint64(r.hdr.ThreadLocalOff) + i*uint64(r.hdr.LocalSize)
	return (*localEntry)(unsafe.Pointer(&r.mem[off]))
}

// Functions snapshots the function table, each function's shared counters
// plus every thread cache entry naming it, in table order. Only the segments
// in use are read (the rest is address space no page of which was touched).
func (r *Region) Functions() []Func {
	n := r.FuncSlots()
	d := r.data(r.threadRange(), r.keysRange())
	idx := make(map[uint32]int)
	var out []Func
	for i := uint64(0); i < n; i++ {
		if !d.has(r.hdr.KeysOff+i*8, 8) {
			continue // a page no key was written to (see extents.go)
		}
		key := atomic.LoadUint64(r.keyAt(i))
		if key == 0 {
			continue
		}
		e := r.funcAt(i)
		f := Func{Addr: key &^ KeyBare, Bare: key&KeyBare != 0}
		f.Entries = atomic.LoadUint64(&e.Entries)
		f.Exits = atomic.LoadUint64(&e.Exits)
		f.SumNs = atomic.LoadUint64(&e.SumNs)
		if inv := atomic.LoadUint64(&e.MinInv); inv != 0 {
			f.MinNs = ^inv
		}
		f.MaxNs = atomic.LoadUint64(&e.MaxNs)
		f.Orphans = atomic.LoadUint64(&e.Orphans)
		f.Unmatched = atomic.LoadUint64(&e.Unmatched)
		f.DeepEntries = atomic.LoadUint64(&e.DeepEntries)
		f.DeepExits = atomic.LoadUint64(&e.DeepExits)
		for b := range f.Hist {
			f.Hist[b] = atomic.LoadUint64(&e.Hist[b])
			f.Samples = addSat(f.Samples, f.Hist[b], &f.Overflow, "samples")
		}
		idx[uint32(i)] = len(out)
		out = append(out, f)
	}
	for s := uint64(0); s < uint64(r.hdr.MaxThreads); s++ {
		if !r.slotUsed(d, s) {
			continue // never claimed: its cache is empty
		}
		for i := uint64(0); i < uint64(r.hdr.LocalFuncs); i++ {
			l := r.localAt(s, i)
			if atomic.LoadUint64(&l.Addr) == 0 {
				continue
			}
			k, ok := idx[atomic.LoadUint32(&l.Gidx)]
			if !ok {
				continue // a cache entry is published after its table entry; a torn read only
			}
			f := &out[k]
			f.Entries = addSat(f.Entries, atomic.LoadUint64(&l.Entries), &f.Overflow, "entries")
			f.Exits = addSat(f.Exits, atomic.LoadUint64(&l.Exits), &f.Overflow, "exits")
			f.SumNs = addSat(f.SumNs, atomic.LoadUint64(&l.SumNs), &f.Overflow, "total_ns")
			// calls in progress in a suspended context (D102): open too
			f.Open = addSat(f.Open, atomic.LoadUint64(&l.Parked), &f.Overflow, "open_frames")
		}
	}
	// Open frames: every stored frame below each claimed slot's depth.
	for s := uint64(0); s < uint64(r.hdr.MaxThreads); s++ {
		if !r.slotUsed(d, s) {
			continue
		}
		slot := r.slotAt(s)
		depth := uint64(atomic.LoadUint32(&slot.Depth))
		if depth > uint64(r.hdr.StackDepth) {
			depth = uint64(r.hdr.StackDepth)
		}
		for i := uint64(0); i < depth; i++ {
			fr := r.frameAt(s, i)
			if k, ok := idx[atomic.LoadUint32(&fr.Gidx)]; ok {
				out[k].Open++
			}
		}
	}
	if len(out) == 0 && r.hdr.MaxFuncs > 0 {
		return []Func{}
	}
	return out
}

// Thread is one thread slot.
type Thread struct {
	Index          int
	Owned          bool  // a live thread holds the slot
	Tid            int32 // owner, or last owner of a free slot
	Generation     uint32
	Depth          uint32
	ReentrantDrops uint64
	StackOverflows uint64
	Orphans        uint64
	Unmatched      uint64
	LocalFull      uint64
	RingHead       uint64
	RingTail       uint64
	RingDropped    uint64
	RingSize       uint32 // events the slot's ring holds now (version 5; 0: unused)
	DeepLost       uint64 // frames deeper than the shadow stack found dead (functions unknown)
	AbandonedHooks uint64 // hooks a signal handler longjmp'd out of
	FentryRestored uint64 // dead hijacked fentry frames whose return slot was given back
	QuotaSkips     uint64 // hooks that recorded nothing: their function's quota was used up
	HookTicks      uint64 // TSC ticks inside the hooks sampled while quotas were on
	HookSamples    uint64 // hooks sampled (one in 64 per thread)
}

// Threads returns every slot that has ever been claimed.
func (r *Region) Threads() []Thread {
	var out []Thread
	d := r.data(r.threadRange())
	for i := uint64(0); i < uint64(r.hdr.MaxThreads); i++ {
		if !r.slotUsed(d, i) {
			continue
		}
		s := r.slotAt(i)
		gen := atomic.LoadUint32(&s.Generation)
		out = append(out, Thread{
			Index:          int(i),
			Owned:          atomic.LoadUint32(&s.State) == slotOwned,
			Tid:            int32(atomic.LoadUint32((*uint32)(unsafe.Pointer(&s.Tid)))),
			Generation:     gen,
			Depth:          atomic.LoadUint32(&s.Depth),
			ReentrantDrops: atomic.LoadUint64(&s.ReentrantDrops),
			StackOverflows: atomic.LoadUint64(&s.StackOverflows),
			Orphans:        atomic.LoadUint64(&s.Orphans),
			Unmatched:      atomic.LoadUint64(&s.Unmatched),
			LocalFull:      atomic.LoadUint64(&s.LocalFull),
			RingHead:       atomic.LoadUint64(&s.RingHead),
			RingTail:       atomic.LoadUint64(&s.RingTail),
			RingDropped:    atomic.LoadUint64(&s.RingDropped),
			RingSize:       atomic.LoadUint32(&s.RingSize),
			DeepLost:       atomic.LoadUint64(&s.DeepLost),
			AbandonedHooks: atomic.LoadUint64(&s.AbandonedHooks),
			FentryRestored: atomic.LoadUint64(&s.FentryRestored),
			QuotaSkips:     atomic.LoadUint64(&s.QuotaSkips),
			HookTicks:      atomic.LoadUint64(&s.HookTicks),
			HookSamples:    atomic.LoadUint64(&s.HookSamples),
		})
	}
	return out
}

// Counters are the region-wide drop and mismatch counts: the header's plus
// the sums over thread slots.
type Counters struct {
	FuncsUsed       uint64
	FuncDropEnters  uint64 // function table at its cap (every segment full along the key's probe sequence)
	FuncDropExits   uint64
	ThreadsClaimed  uint64
	ThreadsActive   uint64
	ThreadOverflows uint64 // threads that found no free slot
	ThreadDropHits  uint64
	PreinitDrops    uint64
	LateDrops       uint64
	FentrySites     uint64 // fentry call sites seen
	FentryBadSites  uint64 // fentry call sites not recognised (entries only, keyed KeyBare)
	FentryUnwound   uint64 // hijacked frames unwound by exceptions or pthread_exit (their exits are unmatched)
	ReentrantDrops  uint64 // hooks inside hooks (signal handlers), and during fork
	StackOverflows  uint64
	Orphans         uint64
	Unmatched       uint64
	LocalFull       uint64
	RingDropped     uint64
	DeepLost        uint64 // frames deeper than the shadow stack found dead (their functions are unknown)
	AbandonedHooks  uint64 // hooks a signal handler longjmp'd out of (the busy word healed)
	FentryRestored  uint64 // dead hijacked fentry frames whose return slot was given back
	// seccomp (D56): the hooks make no system call (Nosys); threads that
	// began under it are not recorded, and the system calls left out
	Nosys        bool
	NosysThreads uint64
	NosysSkips   uint64
	// Overflow names the per-thread sums above that passed 2^64 (held at
	// 2^64-1): see Func.Overflow and ErrOverflow (D92).
	Overflow []string
}

// Counters snapshots the drop and mismatch counters.
func (r *Region) Counters() Counters {
	h := r.Header()
	c := Counters{
		FuncsUsed: h.FuncsUsed, FuncDropEnters: h.FuncDropEnters, FuncDropExits: h.FuncDropExits,
		ThreadsClaimed: h.ThreadsClaimed, ThreadsActive: h.ThreadsActive,
		ThreadOverflows: h.ThreadOverflows, ThreadDropHits: h.ThreadDropHits,
		PreinitDrops: h.PreinitDrops, LateDrops: h.LateDrops,
		FentrySites: h.FentrySites, FentryBadSites: h.FentryBadSites, FentryUnwound: h.FentryUnwound,
		Nosys: h.Nosys != 0, NosysThreads: h.NosysThreads, NosysSkips: h.NosysSkips,
	}
	o := &c.Overflow
	for _, t := range r.Threads() {
		c.ReentrantDrops = addSat(c.ReentrantDrops, t.ReentrantDrops, o, "reentrant")
		c.StackOverflows = addSat(c.StackOverflows, t.StackOverflows, o, "shadow_stack_overflow")
		c.Orphans = addSat(c.Orphans, t.Orphans, o, "orphan_exits")
		c.Unmatched = addSat(c.Unmatched, t.Unmatched, o, "unmatched_entries")
		c.LocalFull = addSat(c.LocalFull, t.LocalFull, o, "local_full")
		c.RingDropped = addSat(c.RingDropped, t.RingDropped, o, "trace_ring_full")
		c.DeepLost = addSat(c.DeepLost, t.DeepLost, o, "deep_frames_lost")
		c.AbandonedHooks = addSat(c.AbandonedHooks, t.AbandonedHooks, o, "abandoned_hooks")
		c.FentryRestored = addSat(c.FentryRestored, t.FentryRestored, o, "fentry_restored")
	}
	return c
}

// NsFromTicks converts a difference of the runtime's clock readings to
// nanoseconds (the runtime already stores latencies in ns; this serves
// ExitTSC and similar raw readings).
func (h *Header) NsFromTicks(ticks uint64) uint64 {
	hi, lo := bits.Mul64(ticks, h.TSCMult)
	return hi<<32 | lo>>32
}
