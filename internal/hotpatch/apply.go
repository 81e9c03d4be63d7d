package hotpatch

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/phases"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/shm"
	"github.com/edgeprobe/edgeprobe/internal/xmod"
)

// Protocols a request may name.
const (
	ProtoAuto      = "auto"       // flip where the site allows it, int3 elsewhere
	ProtoFlip      = "flip"       // one atomic byte store per site
	ProtoInt3      = "int3"       // int3 first, wait and serialise, rest, wait, byte 0
	ProtoInt3Async = "int3-async" // the same as outstanding patches advanced together
	ProtoStop      = "stop"       // stop every thread, check PCs, write, resume
)

// ErrNotFlippable means --protocol flip was asked for a site whose forms
// differ in more than one byte (a nop placeholder).
var ErrNotFlippable = xmod.ErrNotFlippable

// ErrSharedText: another process runs the target's text (it shares the
// target's memory: clone with CLONE_VM, not a thread) and no tracer of
// the target holds it, so only one-byte flips are safe there.
var ErrSharedText = errors.New("another process runs this process's text untraced")

// Action turns the probes a selector matches on or off; later actions win.
type Action struct {
	Enable   bool
	Selector probelist.Selector
	Object   string // only the target mapped from this path; "" for every target
}

// Request is one hotpatch invocation.
type Request struct {
	PID        int
	ProbeFiles []string // empty: scan the process's objects
	Actions    []Action
	Protocol   string        // one of the Proto* constants; "" is auto
	Int3Wait   time.Duration // 0: xmod.DefaultWait
	WaitLock   bool          // queue behind another hotpatch instead of failing
	Brief      bool          // Result.Sites only if something failed (Session.SetBrief)
	// Runtime, when set, has the runtime ensured (EnsureRuntime with these
	// options) under the request's own lock, before its targets are
	// loaded: what an --enable does first. OnRuntime, when set, gets what
	// that found and did, also when it failed (then Apply returns its
	// error and writes nothing).
	Runtime   *RuntimeOptions
	OnRuntime func(*RuntimeStatus)
}

// SiteResult is what happened to one selected site.
type SiteResult struct {
	Object   string `json:"object"`
	ID       int    `json:"id"`
	Function string `json:"function"`
	Kind     string `json:"kind"`
	Provider string `json:"provider"` // "cyg" or "fentry"
	Address  string `json:"address"`  // run-time address
	Want     string `json:"want"`     // "on" or "off"
	Before   string `json:"before"`   // "on", "off" or "foreign"
	After    string `json:"after"`
	Protocol string `json:"protocol"`
}

// Result is the outcome of Apply.
type Result struct {
	PID       int   `json:"pid"`
	OK        bool  `json:"ok"` // every selected site ended in the asked state
	Changed   int   `json:"changed"`
	Unchanged int   `json:"unchanged"`
	Held      int   `json:"threads_held"` // threads caught at an int3 and resumed
	ElapsedNS int64 `json:"elapsed_ns"`   // attach to detach
	// Spans: how a large flip batch was written (coalesced spans or one
	// byte per site, and why); nil for small batches.
	Spans *xmod.SpanStats `json:"spans,omitempty"`
	// Warnings are what the batch saw that the user should know, such as a
	// writer in the target sharing a page we wrote.
	Warnings []string     `json:"warnings,omitempty"`
	Sites    []SiteResult `json:"sites"`
	// Repaired lists the selected sites that held an int3 left by an
	// interrupted hotpatch (killed mid-batch) and were made whole first.
	Repaired []RepairNote `json:"repaired,omitempty"`
}

// RepairNote is one site found torn (an int3 over bytes of its own forms,
// left by a hotpatch killed mid-batch) and restored to a whole form.
type RepairNote struct {
	Object   string `json:"object"`
	ID       int    `json:"id"`
	Function string `json:"function"`
	Kind     string `json:"kind"`
	Address  string `json:"address"`
	Seen     string `json:"seen"` // the bytes it held
	Now      string `json:"now"`  // "on" or "off": the form it was restored to
}

func (n RepairNote) String() string {
	return fmt.Sprintf("repaired %s %s %s at %s: it held %s, an int3 left by an interrupted hotpatch; restored to %s",
		n.Object, n.Kind, n.Function, n.Address, n.Seen, n.Now)
}

type selected struct {
	target *Target
	probe  *probelist.Probe
	on     bool
}

// Apply carries out a request: Open (and the runtime ensured under its
// lock, if asked), Session.Apply, Close. The whole request runs on one
// thread that is its own tracer (ptrace.Run): no request to the tracer is
// handed to another thread (D71). It returns once the process is released.
func Apply(ctx context.Context, req Request) (*Result, error) {
	var res *Result
	var lock *Lock
	err := ptrace.Run(func() error {
		var err error
		res, err = apply(ctx, req, &lock)
		return err
	})
	lock.unflock()
	return res, err
}

func apply(ctx context.Context, req Request, held **Lock) (*Result, error) {
	var ensure func(*Lock) (*RuntimeStatus, error)
	if req.Runtime != nil {
		rt := *req.Runtime
		// (not ForRequest: the protocol asked for is checked too)
		ensure = func(l *Lock) (*RuntimeStatus, error) {
			rt.check = func(objs []procmaps.Object) error { return checkRequest(req, l.Pid(), objs) }
			st, err := ensureRuntime(ctx, l.Pid(), rt, l)
			if req.OnRuntime != nil {
				req.OnRuntime(st)
			}
			phases.Mark("runtime")
			return st, err
		}
	}
	s, err := open(ctx, req.PID, req.ProbeFiles, req.WaitLock, ensure)
	if err != nil {
		return nil, err
	}
	// The inline tracer lets go when this thread exits, after this
	// returns: the flock of a process whose main thread has exited (D95)
	// is dropped after that, by Apply, so that a script's next hotpatch
	// finds the anchor free.
	s.lock.keep = true
	*held = s.lock
	s.SetBrief(req.Brief)
	res, err := s.Apply(ctx, req.Actions, req.Protocol, req.Int3Wait)
	if cerr := s.Close(); cerr != nil && err == nil {
		err = cerr
	}
	return res, err
}

// checkShared refuses a multi-byte protocol (what) while a process that
// shares the target's memory runs untraced (ptrace.UntracedVMSharers): its
// threads would meet the protocol's int3s with no tracer to catch the
// SIGTRAP (review5: a clone(CLONE_VM) child of mt-like code died of
// SIGTRAP at `--protocol int3 --enable work`, which said OK), and stop's
// whole-site writes would not stop it. A one-byte flip is safe for any
// executor (docs/protocols.md, flip).
func (s *Session) checkShared(what string) error {
	var others []int
	if s.tracer != nil {
		others = s.tracer.UntracedVMSharers()
	} else {
		others = ptrace.VMSharers(s.pid)
	}
	if len(others) > 0 {
		return fmt.Errorf("pid %d shares its memory with process %d (a clone with CLONE_VM, not a thread), which runs its text untraced: %s writes sites in more than one byte and could kill it with an int3 or tear an instruction under it; only one-byte flips are safe there (flip placeholders, --protocol flip): %w (nothing was written)",
			s.pid, others[0], what, ErrSharedText)
	}
	return nil
}

// checkRequest makes, on the process's objects as a load is about to
// change them, the checks Apply makes of req before it writes and that need
// no tracer (Session.Check): a request refused there must not load the
// runtime first. (review5: `--enable` of a name that matches nothing, or a
// malformed --probes file, loaded the runtime into the process, said so,
// then refused.) Only a load or a routing pays for it: the targets are read
// again after the load, whose mapping changes the objects.
func checkRequest(req Request, via int, objs []procmaps.Object) error {
	targets, err := loadTargets(via, objs, req.ProbeFiles)
	if err != nil {
		return err
	}
	return (&Session{pid: via, targets: targets}).Check(req.Actions, req.Protocol)
}

// Session holds what repeated toggles of one process share: the lock, the
// targets, and the tracer. Trace and the bursty profiler toggle many times
// a second through one Session.
type Session struct {
	// pid: the thread every /proc path and ptrace request names (the
	// process, or a live thread of it when its main thread has exited:
	// Lock.Pid); shown: the process's pid as the user gave it.
	pid, shown int
	lock       *Lock
	targets    []*Target
	tracer     *ptrace.Tracer
	full       bool        // the tracer holds every thread, not only the leader
	region     *shm.Region // the runtime's region, when the process runs it (openRegion)
	// regionTried: openRegion looked (a process without the runtime is
	// not searched again on every enable).
	regionTried bool
	inflight    *inflightGuard // the runtime's in-flight table (guard), once found
	// handlersDone: awaitHandlers found no SIGTRAP handler repairing; with
	// the leader seized since Open, none starts writing again (D90)
	handlersDone bool
	// regionHeld: Hold took the region's flock (D101).
	regionHeld bool
	mem        *ptrace.Mem // reads without a tracer hand-off (nil: read through the tracer)
	noSpans    bool        // every flip site written alone (SetSpanWrites)
	inBatch    bool        // inside Batch: the tracer may not change
	// threadMem: inside Batch, the target's memory as the tracer thread
	// reaches it (ptrace.ThreadMem), lent for the Batch; nil outside.
	threadMem *ptrace.ThreadMem
	// last: the previous Apply's read after, for the next Apply of the
	// same sites in the same Batch (readBefore, D64); reuseWithin
	// overrides ReuseWithin (tests; negative: never); reused counts.
	last        lastRead
	reuseWithin time.Duration
	reused      int
	brief       bool // Result.Sites only when something failed (SetBrief)
	// prepared remembers what lists of actions selected, ready to apply
	// (prepare); preparedSites counts their sites, to bound the memory.
	prepared      map[string]*prepared
	preparedSites int
	keyBuf        []byte // scratch: a prepared selection's key
	// Scratch of large flip batches, kept from one batch to the next:
	// a span's three copies, and the file's bytes of a span.
	spanScratch, fileScratch []byte
	// imaged: the prepared selections holding span images, oldest first
	// (boundImages).
	imaged []*prepared
	// verified: probes from list files already checked against a scan;
	// verifiedAll: targets whose whole list was.
	verified    map[verifiedKey]bool
	verifiedAll map[*Target]bool
	// maps: the process's maps file, open for checkMapped; mappedAt: when
	// each target was last found mapped as at Open; mappedWithin
	// overrides MappedWithin (tests; negative: every command checks).
	maps         *procmaps.Maps
	mappedAt     map[*Target]time.Time
	mappedWithin time.Duration
	mapFiles     map[uint64]fileID // baseMaps: by executable mapping's start
}

// Open locks pid and loads its targets. The lock is a leader-only attach
// (see Lock), which stops nothing; the protocols that need every thread
// upgrade it in place.
func Open(pid int, probeFiles []string, waitLock bool) (*Session, error) {
	return OpenContext(context.Background(), pid, probeFiles, waitLock)
}

// OpenContext is Open whose wait for the lock ends when ctx does.
func OpenContext(ctx context.Context, pid int, probeFiles []string, waitLock bool) (*Session, error) {
	return open(ctx, pid, probeFiles, waitLock, nil)
}

// open is OpenContext; ensure, when set, runs under the lock before the
// targets are loaded (the runtime ensured, as Session.EnsureRuntime).
func open(ctx context.Context, pid int, probeFiles []string, waitLock bool, ensure func(*Lock) (*RuntimeStatus, error)) (*Session, error) {
	lock, err := AcquireLockContext(ctx, pid, waitLock)
	if err != nil {
		return nil, err
	}
	phases.Mark("lock")
	// From here on every /proc path and ptrace request names the thread
	// the lock reaches the process through: pid, or a live thread when
	// the main thread has exited (D95).
	shown := pid
	pid = lock.Pid()
	full := false
	var objs []procmaps.Object
	if ensure != nil {
		st, err := ensure(lock)
		if err != nil {
			lock.Release()
			return nil, err
		}
		full = st != nil && st.Load != nil // inject.Load upgraded the tracer
		if st != nil {
			objs = st.objects // read under this lock, nothing loaded since
		}
	}
	var targets []*Target
	if objs != nil {
		targets, err = loadTargets(pid, objs, probeFiles)
	} else {
		targets, err = LoadTargets(pid, probeFiles)
	}
	if err != nil {
		lock.Release()
		if !Gone(err) && processGone(shown) {
			// It exited while we read its maps: say that, not "stale list".
			err = exitedErr(shown, err)
		}
		return nil, err
	}
	s := &Session{pid: pid, shown: shown, lock: lock, targets: targets, tracer: lock.Tracer(), full: full}
	// The maps file is opened with the targets, so that it belongs to the
	// address space they were read from: after an exec it answers nothing
	// (checkMapped leaves that to the site reads, which name the exec).
	if m, err := procmaps.OpenMaps(pid); err == nil {
		s.maps = m
		s.baseMaps()
	}
	phases.Mark("targets")
	return s, nil
}

// openRegion opens the runtime's region, once: only an enable needs it
// (newGeneration), and finding it lists the process's descriptors. Best
// effort: a process without the runtime (or with a runtime of another
// layout) records nothing whose frames could go stale.
func (s *Session) openRegion() {
	if s.region != nil || s.regionTried {
		return
	}
	s.regionTried = true
	if r, err := shm.OpenPID(s.pid); err == nil {
		if r.Writable() {
			s.region = r
		} else {
			r.Close()
		}
	}
}

// Targets are the session's instrumented objects.
func (s *Session) Targets() []*Target { return s.targets }

// Close detaches (the kernel then lets every thread run as if never traced),
// which releases the lock.
func (s *Session) Close() error {
	var err error
	if s.tracer != nil {
		err = s.tracer.Detach()
		s.tracer = nil
	}
	if s.region != nil {
		s.region.Close()
	}
	if s.mem != nil {
		s.mem.Close()
	}
	if s.maps != nil {
		s.maps.Close()
	}
	s.lock.t = nil // the session's tracer was the lock's
	if !s.lock.keep {
		s.lock.unflock() // after the tracer let go
	}
	return err
}

// attach makes sure a tracer of the needed kind is attached. Seizing comes
// before touching memory: kernels booted with proc_mem.force_override=ptrace
// allow /proc/PID/mem writes to text only from the tracer. Flip needs only
// the leader and stops nothing; the other protocols need every thread.
//
// The session's tracer is its lock (Open attached the leader), so it is
// never dropped and re-attached: another hotpatch could take the process
// in between. Upgrading keeps the leader throughout.
func (s *Session) attach(full bool) error {
	if s.tracer == nil {
		return fmt.Errorf("pid %d: %w", s.pid, ptrace.ErrDetached)
	}
	if !full || s.full {
		return nil
	}
	if s.inBatch {
		return ErrNeedsFullAttach
	}
	if err := s.tracer.Upgrade(); err != nil {
		return err
	}
	s.full = true
	return nil
}

// Check makes the checks Apply makes of actions before it touches the
// process: what they select (ErrNoMatch), the listed probes against a scan
// of their object (ErrUnverified), the protocol (ErrNotFlippable). Nothing
// is read from the process but its objects' files. What passes is kept for
// the Apply of the same actions and protocol.
//
// It also looks for a process sharing the target's memory when the
// protocols chosen write more than one byte (ErrSharedText, which Apply
// refuses after attaching): the check came after the runtime load, which
// a refused request must not make (D83, D87). Without a tracer (a request's
// check before its load) every such process counts: none is traced before
// hotpatch attaches, and attaching seizes only the target's threads.
func (s *Session) Check(actions []Action, protocol string) error {
	p, err := s.check(actions, protocol)
	if err != nil {
		return err
	}
	for _, proto := range []string{ProtoStop, ProtoInt3, ProtoInt3Async} {
		if len(p.byProto[proto]) > 0 {
			return s.checkShared(proto)
		}
	}
	return nil
}

func (s *Session) check(actions []Action, protocol string) (*prepared, error) {
	if protocol == "" {
		protocol = ProtoAuto
	}
	p, err := s.prepare(actions, protocol)
	if err != nil {
		return nil, err
	}
	if !p.verified {
		if err := s.verify(p.sel); err != nil {
			return p, err
		}
		p.verified = true
	}
	return p, p.protoErr
}

// Apply performs the actions. On any error before the first write, nothing
// is written; once writing, a cancelled ctx (SIGINT) or the target exiting
// ends the batch with every site in one of its two forms.
//
// What a list of actions selects is prepared once per session (prepare):
// the selection, its sites checked and sorted, each site's protocol, and
// (once it passed) the check of listed probes against a scan. Every Apply
// still reads every site before writing (refusing the whole request if
// any is foreign, repairing torn ones), writes through the protocols, and
// reads every site back (but those a span's clean read-back has just shown
// in their new form: docs/decisions.md, D50).
func (s *Session) Apply(ctx context.Context, actions []Action, protocol string, int3Wait time.Duration) (*Result, error) {
	start := time.Now()
	last := s.last // the previous Apply's read, used at most once (readBefore)
	s.last = lastRead{}
	if err := s.reanchor(); err != nil {
		return nil, err
	}
	p, err := s.check(actions, protocol)
	if p != nil {
		defer s.boundImages(p) // whatever this Apply kept (D61), however it ends
	}
	if err != nil {
		return nil, err
	}
	phases.Mark("prepare")
	if err := s.attach(!p.onlyFlip); err != nil {
		return nil, err
	}
	// Flip writes byte 0 of whole sites only, which a SIGTRAP handler
	// never writes (it writes sites holding int3, which flip refuses):
	// only the other protocols wait for one (D90).
	if !p.onlyFlip {
		if err := s.awaitHandlers(); err != nil {
			return nil, err
		}
	}
	for _, proto := range []string{ProtoStop, ProtoInt3, ProtoInt3Async} {
		if len(p.byProto[proto]) > 0 {
			if err := s.checkShared(proto); err != nil {
				return nil, err
			}
			break
		}
	}
	if err := s.checkMapped(p.targets, start); err != nil {
		return nil, err
	}
	before, err := s.readBefore(p, last, start)
	if err != nil {
		if pid := s.shownPid(); (Gone(err) || errors.Is(err, ptrace.ErrExec)) && !processGone(pid) && procfs.HasMemory(procfs.Via(pid)) {
			// The memory we opened is gone but the process is not: it ran
			// exec, and the sites went with its old program. (Also when a
			// thread other than the main one ran it after the main thread
			// had exited: the thread we worked through is gone, and the
			// process has a main thread again, D95.)
			err = fmt.Errorf("pid %d ran exec: the program whose probes these are is gone (%v): %w", pid, err, ptrace.ErrExited)
		}
		return nil, s.unloadedErr(err)
	}
	p.before = before
	phases.Mark("before")
	res := &Result{PID: s.shownPid()}
	// A site a killed hotpatch left mid-patch is ours: make it whole first
	// (and say so), rather than refusing it as foreign forever. (One pass
	// finds whether any site is in neither form; only then are they sorted
	// out.)
	var torn []selected
	whole := allForms(before)
	if !whole {
		for i, st := range before {
			if st == xmod.StateTorn {
				torn = append(torn, p.sel[i])
			}
		}
	}
	if len(torn) > 0 {
		notes, err := s.repair(ctx, torn, int3Wait)
		res.Repaired = notes
		if err != nil {
			return res, err
		}
		if before, err = p.batch.Classify(s.reader(), p.before); err != nil {
			return res, err
		}
		p.before = before
		whole = allForms(before)
	}
	// Refuse the whole request if any site is foreign, so that no protocol's
	// batch is written before another's is refused: all or nothing.
	if !whole {
		for i, st := range before {
			if st == xmod.StateInvalid || st == xmod.StateTorn {
				return nil, fmt.Errorf("%v in %s holds neither its active nor its inert bytes: %w (nothing was written)",
					p.sites[i], p.sel[i].target.Object.Path, ErrStale)
			}
		}
	}
	s.newGeneration(p, before)
	var runErr error
	for _, proto := range []string{ProtoFlip, ProtoStop, ProtoInt3, ProtoInt3Async} {
		changes := p.byProto[proto]
		if len(changes) == 0 {
			continue
		}
		var r xmod.Result
		var err error
		switch {
		case proto == ProtoFlip && p.onlyFlip:
			r, err = s.flipPrepared(ctx, p, before, res)
		case proto == ProtoFlip:
			r, err = s.flip(ctx, changes, res)
		default:
			r, err = run(ctx, s.tracer, proto, changes, xmod.Int3Options{Wait: int3Wait, Guard: s.guard()})
		}
		res.Changed += r.Changed
		res.Unchanged += r.Unchanged
		res.Held += r.Held
		if err != nil {
			runErr = fmt.Errorf("%s protocol: %w", proto, err)
			break
		}
	}
	// The read after: every site, but those a span's clean read-back has
	// just shown in their new form (D50).
	phases.Mark("write")
	var after []xmod.State
	var afterErr error
	afterAt := time.Now()
	if p.onlyFlip && runErr == nil {
		after, afterErr = p.batch.ClassifyAfterFlip(s.reader(), p.after)
	} else {
		after, afterErr = p.batch.Classify(s.reader(), p.after)
	}
	if afterErr == nil {
		p.after = after
	}
	phases.Mark("after")
	res.ElapsedNS = time.Since(start).Nanoseconds()
	res.OK = runErr == nil && afterErr == nil
	if res.OK {
		res.OK = xmod.SameStates(after, p.want)
	}
	if res.OK && s.inBatch {
		s.keepAfter(p, afterAt)
	}
	if !s.brief || !res.OK || runErr != nil {
		res.Sites = p.results(before, after, afterErr)
	}
	if runErr == nil && afterErr != nil {
		runErr = fmt.Errorf("reading sites back: %w", afterErr)
	}
	runErr = s.unloadedErr(runErr)
	if runErr != nil {
		switch {
		case Gone(runErr) || processGone(s.shownPid()):
			runErr = exitedErr(s.shownPid(), runErr)
		case ctx.Err() != nil:
			runErr = fmt.Errorf("interrupted: %w", runErr)
		}
		runErr = fmt.Errorf("%w (sites now: %s)", runErr, Tally(res.Sites))
	}
	return res, runErr
}

// unloadedErr is err, a failed read or write of sites, said as ErrUnmapped
// when an object of the session is no longer mapped where the session found
// it: a plugin dlclose'd after the check of D77, or between a write and its
// read-back, makes the access fail with an I/O error, and a capture ends
// as it does for an unload a command finds first (profile: "unloaded an
// object the profile had probes in") rather than failing (review6:
// TestProfilePluginUnloaded failed so once, `reading sites back: read 5
// bytes at 0x...: input/output error`). err itself otherwise.
func (s *Session) unloadedErr(err error) error {
	if err == nil || Gone(err) || errors.Is(err, ErrUnmapped) {
		return err
	}
	if gone := s.Unmapped(); len(gone) > 0 {
		return fmt.Errorf("%w; %s: %w", err, strings.Join(gone, ", "), ErrUnmapped)
	}
	return err
}

// allForms reports whether every state is active or inert.
func allForms(st []xmod.State) bool {
	for _, s := range st {
		if s != xmod.StateActive && s != xmod.StateInert {
			return false
		}
	}
	return true
}

func stateOf(on bool) xmod.State {
	if on {
		return xmod.StateActive
	}
	return xmod.StateInert
}

// SetBrief makes Apply leave Result.Sites nil when every site ended in the
// asked state and nothing failed: a session's script reads the counts, and
// 40,000 per-site results cost more than the toggle (see D46). A failed
// request still lists every site.
func (s *Session) SetBrief(on bool) { s.brief = on }

// newGeneration tells the runtime, just before their probes go on, that the
// functions about to be enabled start a new generation: a shadow frame left
// by a call whose exit was missed while they were off must not be matched by
// the exit of a call that entered unseen (see shm.Region.NewGeneration).
func (s *Session) newGeneration(p *prepared, before []xmod.State) {
	keys := p.gen[:0]
	for i, k := range p.genKey {
		// Adjacent duplicates (a function's entry and exit) once: a second
		// increment of the same generation adds nothing.
		if k != 0 && before[i] != xmod.StateActive && (len(keys) == 0 || keys[len(keys)-1] != k) {
			keys = append(keys, k)
		}
	}
	if len(keys) > 0 {
		s.openRegion()
		if s.region != nil {
			s.region.NewGeneration(keys)
		}
	}
	p.gen = keys
}

// Gone reports whether err says the target process does not exist or
// exited while we worked on it (the CLI's exit status 4).
func Gone(err error) bool {
	return errors.Is(err, ptrace.ErrExited) || errors.Is(err, procfs.ErrNoProcess)
}

// exitedErr is the one-line error for a target that went away mid-run.
// A process whose main thread exited runs on (ErrLeaderExited): it is not
// gone, and saying so would end a session that flip commands still serve.
func exitedErr(pid int, cause error) error {
	if procfs.LeaderExited(pid) {
		// The thread the lock reached it through exited (D95): the
		// process runs on; a new command takes another.
		return fmt.Errorf("pid %d: %w, and the thread hotpatch reached it through exited (%v): run the command again", pid, procfs.ErrLeaderExited, cause)
	}
	if errors.Is(cause, ptrace.ErrExited) {
		return fmt.Errorf("pid %d exited: %w", pid, cause)
	}
	return fmt.Errorf("pid %d exited (%v): %w", pid, cause, ptrace.ErrExited)
}

// processGone reports whether pid no longer runs (absent, or a zombie).
// A process whose main thread has exited runs on (D95).
func processGone(pid int) bool { return procfs.Gone(pid, 0) && !procfs.LeaderExited(pid) }

// Tally summarises where sites ended, e.g. "3 on, 5 off", for one-line errors.
func Tally(sites []SiteResult) string {
	var order []string
	n := map[string]int{}
	for _, s := range sites {
		if n[s.After] == 0 {
			order = append(order, s.After)
		}
		n[s.After]++
	}
	parts := make([]string, len(order))
	for i, st := range order {
		parts[i] = fmt.Sprintf("%d %s", n[st], st)
	}
	return strings.Join(parts, ", ")
}

// resolve applies the actions in order to every target's probes.
func resolve(targets []*Target, actions []Action) ([]selected, error) {
	if len(actions) == 0 {
		return nil, errors.New("nothing to do: give --enable or --disable")
	}
	if len(actions) == 1 {
		// One action (`--enable '*'`): what it selects is the answer, each
		// probe once; no map of 40,000 keys to merge later actions into.
		if sel, ok, err := resolveOne(targets, actions[0]); ok || err != nil {
			return sel, err
		}
	}
	type key struct{ t, p int }
	want := map[key]bool{}
	var order []key
	for _, a := range actions {
		matched := false
		for ti, t := range targets {
			if a.Object != "" && a.Object != t.Object.Path {
				continue
			}
			idx, err := t.List.Select(a.Selector)
			if errors.Is(err, probelist.ErrNoMatch) {
				continue
			}
			if err != nil { // an fentry probe asked for its exit: see probelist.ErrNoExitSite
				return nil, fmt.Errorf("%s: %w", t.Object.Path, err)
			}
			matched = true
			for _, pi := range idx {
				k := key{ti, pi}
				if _, seen := want[k]; !seen {
					order = append(order, k)
				}
				want[k] = a.Enable
			}
		}
		if !matched {
			return nil, fmt.Errorf("%w %q (kind %s%s)", probelist.ErrNoMatch, a.Selector.Pattern, kindOrBoth(a.Selector.Kind), providerNote(a.Selector.Provider))
		}
	}
	sel := make([]selected, len(order))
	for i, k := range order {
		p, err := targets[k.t].Probe(k.p)
		if err != nil {
			return nil, err
		}
		sel[i] = selected{target: targets[k.t], probe: p, on: want[k]}
	}
	return sel, nil
}

// resolveOne is resolve for one action; ok is false when a target's
// selection is not strictly ascending (the general path then merges it).
func resolveOne(targets []*Target, a Action) (sel []selected, ok bool, err error) {
	matched := false
	for _, t := range targets {
		if a.Object != "" && a.Object != t.Object.Path {
			continue
		}
		idx, err := t.List.Select(a.Selector)
		if errors.Is(err, probelist.ErrNoMatch) {
			continue
		}
		if err != nil {
			return nil, false, fmt.Errorf("%s: %w", t.Object.Path, err)
		}
		matched = true
		for k := 1; k < len(idx); k++ {
			if idx[k] <= idx[k-1] {
				return nil, false, nil
			}
		}
		if sel == nil {
			sel = make([]selected, 0, len(idx))
		}
		for _, pi := range idx {
			p, err := t.Probe(pi)
			if err != nil {
				return nil, false, err
			}
			sel = append(sel, selected{target: t, probe: p, on: a.Enable})
		}
	}
	if !matched {
		return nil, false, fmt.Errorf("%w %q (kind %s%s)", probelist.ErrNoMatch, a.Selector.Pattern, kindOrBoth(a.Selector.Kind), providerNote(a.Selector.Provider))
	}
	return sel, true, nil
}

func protocolFor(proto string, p *probelist.Probe) string {
	if proto != ProtoAuto {
		return proto
	}
	if p.DifferingBytes() == 1 {
		return ProtoFlip
	}
	return ProtoInt3
}

func siteOf(s selected) xmod.Site {
	return xmod.Site{
		Addr:   s.target.Object.Runtime(uint64(s.probe.Address)),
		Active: s.probe.Active,
		Inert:  s.probe.Inert,
		Name:   strconv.Itoa(s.probe.ID) + " (" + s.probe.Kind + " " + s.probe.Function + ")", // not Sprintf: a session formats it per toggle
	}
}

func run(ctx context.Context, t *ptrace.Tracer, proto string, changes []xmod.Change, opts xmod.Int3Options) (xmod.Result, error) {
	switch proto {
	case ProtoFlip:
		return xmod.Flip(ctx, t, changes, xmod.FlipOptions{})
	case ProtoStop:
		return xmod.Stop(ctx, t, changes, xmod.StopOptions{})
	case ProtoInt3:
		return xmod.Int3(ctx, t, changes, opts)
	case ProtoInt3Async:
		// Never return with a patch outstanding: a failed Start (some int3s
		// may be written) or Drain (a Sync timed out) aborts, which rolls
		// back first-phase patches and completes the others.
		a := xmod.NewAsync(t, opts)
		r, err := a.Start(ctx, changes)
		if err != nil {
			return r, errors.Join(err, abortErr(a))
		}
		if err := a.Drain(ctx); err != nil {
			return r, errors.Join(err, abortErr(a))
		}
		r.Held = a.Held()
		return r, nil
	}
	return xmod.Result{}, fmt.Errorf("unknown protocol %q", proto)
}

// abortErr aborts what a is still doing, if anything; Drain already aborts
// on a cancelled ctx, so this acts after a failed Sync or write.
func abortErr(a *xmod.Async) error {
	if a.Pending() == 0 {
		return nil
	}
	if err := a.Abort(); err != nil {
		return fmt.Errorf("abort: %w", err)
	}
	return nil
}

// states reads each selected site's live state.
func states(m xmod.Mem, sel []selected) ([]string, error) {
	sites := make([]xmod.Site, len(sel))
	for i, s := range sel {
		sites[i] = siteOf(s)
	}
	return siteStates(m, sites)
}

// siteStates reads each site's live state.
func siteStates(m xmod.Mem, sites []xmod.Site) ([]string, error) {
	st, err := xmod.Classify(m, sites)
	if err != nil {
		return nil, err
	}
	out := make([]string, len(st))
	for i, s := range st {
		out[i] = stateName(s)
	}
	return out, nil
}

// stateTorn is what list and results call xmod.StateTorn.
const stateTorn = "mid-patch"

func stateName(s xmod.State) string {
	switch s {
	case xmod.StateActive:
		return "on"
	case xmod.StateInert:
		return "off"
	case xmod.StateTorn:
		return stateTorn
	}
	return "foreign"
}

// repair makes the given torn sites whole (xmod.Repair) with every thread
// traced, so threads reaching their int3 meanwhile are held, not killed.
func (s *Session) repair(ctx context.Context, sel []selected, int3Wait time.Duration) ([]RepairNote, error) {
	if err := s.attach(true); err != nil {
		return nil, err
	}
	if err := s.checkShared("repair"); err != nil {
		return nil, err
	}
	if err := s.awaitHandlers(); err != nil {
		return nil, err
	}
	sites := make([]xmod.Site, len(sel))
	byAddr := map[uint64]selected{}
	for i, c := range sel {
		sites[i] = siteOf(c)
		byAddr[sites[i].Addr] = c
	}
	done, err := xmod.Repair(ctx, s.tracer, sites, xmod.Int3Options{Wait: int3Wait, Guard: s.guard()})
	var notes []RepairNote
	for _, r := range done {
		c := byAddr[r.Site.Addr]
		notes = append(notes, RepairNote{Object: c.target.Object.Path, ID: c.probe.ID, Function: c.probe.Function, Kind: c.probe.Kind,
			Address: fmt.Sprintf("%#x", r.Site.Addr), Seen: probelist.Bytes(r.Seen).String(), Now: onOff(r.On)})
	}
	if err != nil {
		return notes, fmt.Errorf("repairing %d site(s) left mid-patch: %w", len(sel), err)
	}
	return notes, nil
}

// Repair finds every probe site of the session's targets that holds an int3
// left by an interrupted hotpatch and restores it to a whole form (the one
// its other bytes already are; off where that is ambiguous). Sites in
// neither form are not touched. It returns what it repaired.
func (s *Session) Repair(ctx context.Context, int3Wait time.Duration) ([]RepairNote, error) {
	var all []selected
	for _, t := range s.targets {
		for i := 0; i < t.List.Len(); i++ {
			p, err := t.Probe(i)
			if err != nil {
				return nil, err
			}
			all = append(all, selected{target: t, probe: p})
		}
	}
	if err := s.checkMapped(s.targets, time.Now()); err != nil {
		return nil, err
	}
	mem, err := ptrace.OpenMem(s.pid)
	if err != nil {
		return nil, err
	}
	st, err := states(mem, all)
	mem.Close()
	if err != nil {
		return nil, err
	}
	var torn []selected
	for i := range all {
		if st[i] == stateTorn {
			torn = append(torn, all[i])
		}
	}
	if len(torn) == 0 {
		return nil, nil
	}
	return s.repair(ctx, torn, int3Wait)
}

func onOff(on bool) string {
	if on {
		return "on"
	}
	return "off"
}

func providerNote(p string) string {
	if p == "" || p == probelist.ProviderAll {
		return ""
	}
	return ", provider " + p
}

func kindOrBoth(k string) string {
	if k == "" {
		return probelist.KindBoth
	}
	return k
}

// Restore puts every site of a result back into the state it held before
// it, so a capture (trace, profile) leaves the probes as it found them. It
// does not skip the sites the result did not change: a profile toggles them
// per epoch after that result (issue 11: probes that were on came back off).
// Sites already in their old state cost a read.
func (s *Session) Restore(ctx context.Context, res *Result) error {
	var actions []Action
	var gone []string
	for _, r := range res.Sites {
		if r.Before != "on" && r.Before != "off" {
			continue
		}
		if slices.Contains(gone, r.Object) {
			continue
		}
		if t := s.targetAt(r.Object); t != nil && s.maps != nil && errors.Is(s.stillMapped(t), ErrUnmapped) {
			// Unloaded (or replaced) since: its probes went with it, and
			// what lies there now is not ours to write (D77). The others
			// are restored all the same.
			gone = append(gone, r.Object)
			continue
		}
		sel, err := probelist.ParseSelector(fmt.Sprintf("id:%d", r.ID), "")
		if err != nil {
			return err
		}
		actions = append(actions, Action{Enable: r.Before == "on", Selector: sel, Object: r.Object})
	}
	var err error
	if len(actions) > 0 {
		_, err = s.Apply(ctx, actions, ProtoAuto, 0)
	}
	if len(gone) > 0 {
		err = errors.Join(err, fmt.Errorf("%s: %w", strings.Join(gone, ", "), ErrUnmapped))
	}
	return err
}

// ErrUnmapped: an object whose probes a Restore was to put back is no
// longer mapped where the session found it (unloaded, or replaced): its
// probes went with it, and nothing was written there.
var ErrUnmapped = errors.New("no longer mapped where the session found it: its probes went with it (nothing written there)")

// targetAt is the session's target mapped from path, or nil.
func (s *Session) targetAt(path string) *Target {
	for _, t := range s.targets {
		if t.Object.Path == path {
			return t
		}
	}
	return nil
}

// shownPid is the process's pid as the user named it.
func (s *Session) shownPid() int {
	if s.shown != 0 {
		return s.shown
	}
	return s.pid
}

// reanchor replaces the thread a session reaches a process through once
// its main thread has exited (D95), when that thread has exited too: the
// session still holds the process's lock (the flock), so it seizes another
// live thread, as the lock would; one another tracer holds ends the
// command (ErrBusy, D101) rather than being passed over. Only a session whose tracer holds that
// thread alone (flip), and not inside Batch (which looks before it
// starts); with a tracer of every thread the command fails on its own
// path (exitedErr, or the exec it finds). One stat read per command or
// Batch, and only for such a process.
func (s *Session) reanchor() error {
	if s.shown == 0 || s.shown == s.pid || s.lock == nil || s.lock.fd < 0 || !procfs.Gone(s.pid, 0) {
		return nil
	}
	if s.full || s.inBatch || s.tracer == nil {
		// The command's own path finds its tracer gone and says why: the
		// program ran exec, or the thread exited (exitedErr).
		return nil
	}
	if s.execed() {
		return fmt.Errorf("pid %d ran exec: the program whose probes these are is gone (the thread hotpatch reached it through, %d, exited with it): %w", s.shown, s.pid, ptrace.ErrExited)
	}
	gone := fmt.Errorf("pid %d: %w, and the thread hotpatch reached it through (%d) exited: run the command again", s.shown, procfs.ErrLeaderExited, s.pid)
	tids, err := liveThreads(s.shown)
	if err != nil {
		return err
	}
	for _, tid := range tids {
		opts := lockOptions()
		opts.Process = s.shown
		t, err := ptrace.Attach(tid, opts)
		if errors.Is(err, ptrace.ErrTraced) {
			// Not the next one: a tracer of a thread of the process
			// may be another hotpatch that reads another /proc
			// instance and took the lock there (D101), or a debugger.
			who := "another tracer"
			if holder := tracerOf(tid); holder > 0 {
				who = describeTracer(holder)
			}
			return fmt.Errorf("pid %d: the thread hotpatch reached it through (%d) exited, and thread %d is traced by %s: %w", s.shown, s.pid, tid, who, ErrBusy)
		}
		if err != nil {
			gone = fmt.Errorf("%w (thread %d: %v)", gone, tid, err)
			continue // exited meanwhile: the next
		}
		_ = s.tracer.Detach() // it traced nothing that lives
		s.tracer, s.lock.t, s.lock.via, s.pid = t, t, tid, tid
		return nil
	}
	return gone
}

// execed reports whether the address space the session's targets were
// read from is gone while the process runs on: it ran exec (from any
// thread). The maps file opened with the targets answers nothing then.
func (s *Session) execed() bool {
	if s.maps == nil || len(s.targets) == 0 || len(s.targets[0].Object.Exec) == 0 {
		return false
	}
	_, ok, err := s.maps.Covering(s.targets[0].Object.Exec[0].Start)
	return (err != nil || !ok) && !processGone(s.shown)
}
