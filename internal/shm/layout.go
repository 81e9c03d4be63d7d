package shm

// The constants and structs below mirror runtime/edgeprobe_shm.h exactly
// (TestLayoutMatchesC checks every offset and size against the C compiler).

// Magic is "EDGEPRB1" read as a little-endian uint64.
const Magic uint64 = 0x3142525045474445

// Version is the layout version this package reads.
const Version uint32 = 9

// MinVersion is the oldest layout version this package still reads. Version
// 5 made the function table a chain of segments with its keys in an array of
// their own, after the rings, so older regions are not read. Version 6 only
// named padding of the thread slot (D58: the verdict a thread keeps on the
// trace filters, which this package's SetFilter renews and a reader of
// version 5 would not), so a version-5 region reads the same. Version 7
// stamps each ring's events with the generation they were decided under
// (DataGen records, D79); older regions' events carry none (Stamped).
// Version 8 only names header padding: Inflight, the address of the
// process's in-flight table (D89), 0 in older regions (no table).
// Version 9 makes a thread cache entry 64 bytes (D98; 48 before): the
// stride is the header's local_size, checked against the version.
const MinVersion uint32 = 5

// The function table's hash (runtime/edgeprobe_shm.h: EP_HASH_MUL,
// EP_HASH_STEP): segment k of a key's probe sequence starts at the top 32
// bits of h_k, h_0 = key * hashMul, h_(k+1) = (h_k ^ h_k>>29) * hashStep.
const (
	hashMul  uint64 = 0x9E3779B97F4A7C15
	hashStep uint64 = 0xBF58476D1CE4E5B9
)

const (
	HeaderSize  = 4096 // bytes of Header
	HistBuckets = 60   // bucket b counts latencies in [2^b, 2^(b+1)) ns; bucket 0 is [0, 2); the last also takes longer ones
	funcSize    = 576
	threadSize  = 192
	localSize   = 64
	localSizeV8 = 48 // versions 5 to 8
	frameSize   = 48
	eventSize   = 16
)

// KeyBare marks a function-table key recorded by clang's
// __cyg_profile_func_enter_bare: the rest of the key is a return address
// inside the instrumented function, not its entry point.
const KeyBare uint64 = 1 << 63

// Fentry provider modes (Header.FentryMode).
const (
	FentryUsed     uint32 = 1 // a __fentry__ hook has run
	FentryExits    uint32 = 2 // exit probes (return-address hijacking) on
	FentryExitsOff uint32 = 4 // EDGEPROBE_FENTRY_EXITS=0: entries only
	FentrySHSTK    uint32 = 8 // CET user shadow stack on: exit probes refused, entries only
)

// Clock kinds (Header.ClockKind).
const (
	ClockTSC  = 1 // rdtsc ticks; ns = ticks * TSCMult >> 32
	ClockMono = 2 // clock_gettime(CLOCK_MONOTONIC)
)

// Region states (Header.State).
const (
	StateRunning = 1
	StateExited  = 2
)

// Control bits (Header.Control), written by readers and read by every hook.
const (
	CtlTrace  uint32 = 1  // append enter/exit events to the per-thread rings
	CtlNoTime uint32 = 2  // count only: no clock reads, no latency
	CtlPause  uint32 = 4  // record nothing
	CtlQuota  uint32 = 8  // per-function quotas: at most QuotaK recorded calls per quota epoch
	CtlFilter uint32 = 16 // trace events only within Header.FilterDepth and FilterTid
	// CtlArgs (with CtlTrace): fentry functions with a plan in the header's
	// ArgPlan table get an EvData record after their entry and exit events.
	CtlArgs uint32 = 0x100

	// FilterTids is how many threads a trace filter can name.
	FilterTids = 8
)

// Event kinds.
const (
	EvEnter  = 0
	EvExit   = 1
	EvThread = 2 // a thread claimed the slot; Event.Addr holds its tid
	EvData   = 3 // arguments or a return value: Event.Sub, Spec, Data
)

// EvData records (runtime/edgeprobe_shm.h describes the payload).
const (
	DataArgs = 1 // after an EvEnter: argument registers, stack bytes, strings
	DataRet  = 2 // after an EvExit: return registers, string
	// DataGen (version 7, D79): the events after it in the ring, up to the
	// next one, were decided under a control|gen word of this generation
	// (Spec's low 32 bits). Consume keeps it to itself (Event.Gen).
	DataGen = 3

	dataSubShift   = 60
	dataSlotsShift = 52
	dataSpecMask   = 1<<52 - 1

	StrMax      = 64    // bytes copied from a char *
	StackMax    = 64    // bytes of stack arguments copied
	StrComplete = 0x100 // string status: a NUL ended the bytes
	StrFault    = 0x200 // string status: unreadable

	// ArgPlans is the size of the header's plan table.
	ArgPlans = 128
)

// Plan spec bits (a plan's Spec and an EvData record's).
const (
	PlanEntry uint64 = 1 << 40 // record the arguments
	PlanExit  uint64 = 1 << 41 // record the return value
	PlanRStr  uint64 = 1 << 36 // the return value is a char *
)

// PlanSpec packs what to copy: integer argument registers (bit i: rdi, rsi,
// rdx, rcx, r8, r9), SSE argument registers (xmm0..7), those integer
// registers that hold a char *, stack bytes (<= StackMax), return integer
// registers (rax, rdx), return SSE registers (xmm0, xmm1).
func PlanSpec(intRegs, sseRegs, strRegs uint8, stack int, retInt, retSSE uint8) uint64 {
	stack = min(max(stack, 0), StackMax)
	return uint64(intRegs&0x3f) | uint64(sseRegs)<<8 | uint64(strRegs&0x3f)<<16 | uint64(stack)<<24 |
		uint64(retInt&3)<<32 | uint64(retSSE&3)<<34
}

// SpecInt and friends unpack a spec.
func SpecInt(s uint64) uint8  { return uint8(s & 0x3f) }
func SpecSSE(s uint64) uint8  { return uint8(s >> 8) }
func SpecStr(s uint64) uint8  { return uint8(s>>16) & 0x3f }
func SpecStack(s uint64) int  { return int(s>>24) & 0x7f }
func SpecRInt(s uint64) uint8 { return uint8(s>>32) & 3 }
func SpecRSSE(s uint64) uint8 { return uint8(s>>34) & 3 }

// argPlan is struct ep_argplan.
type argPlan struct {
	Key  uint64
	Spec uint64
}

const (
	evKindShift = 62
	evTSMask    = 1<<62 - 1
	slotOwned   = 1
)

// Header is struct ep_header.
type Header struct {
	Magic       uint64
	Version     uint32
	HeaderSize  uint32
	RegionSize  uint64
	Pid         int32
	Ppid        int32
	HistBuckets uint32
	ClockKind   uint32
	TSCMult     uint64
	TSC0        uint64
	Mono0       uint64

	Real0          uint64
	FuncOff        uint64
	MaxFuncs       uint32
	FuncSize       uint32
	ThreadOff      uint64
	MaxThreads     uint32
	ThreadSize     uint32
	ThreadLocalOff uint32
	LocalFuncs     uint32
	LocalSize      uint32
	ThreadStackOff uint32
	StackDepth     uint32
	FrameSize      uint32
	RingOff        uint64
	RingStride     uint64
	RingEvents     uint32
	EventSize      uint32
	MaxProbe       uint32
	FuncFirst      uint32 // slots of the function table's segment 0
	CalibNs        uint64
	MapsOff        uint64
	MapsLen        uint64
	InitMono       uint64

	State       uint32
	FentryMode  uint32
	ExitMono    uint64
	ExitTSC     uint64
	KeysOff     uint64 // the function table's keys: MaxFuncs uint64s
	FuncSegs    uint32 // function-table segments in use (grows while the process runs)
	FilterEpoch uint32 // bumped by each capture with FilterMinNs (marks on shadow frames)
	// a --rate trace's quota epochs (D55): a call whose quota slot was taken
	// in an epoch in [QtraceLo, QtraceHi] (QtraceHi 0: no end) writes its
	// enter event, others none; QtraceLo 0: events follow CtlTrace
	QtraceLo uint32
	QtraceHi uint32
	_        [2]uint64

	Control    uint32
	Gen        uint32 // process-wide generation: NewGeneration adds 1 and stores it in each function's Gen
	QuotaK     uint32 // CtlQuota: calls a function may record per quota epoch
	QuotaEpoch uint32 // the current quota epoch
	// CtlFilter: trace events only below FilterDepth (0: any depth) and of
	// the threads in FilterTid (first 0: every thread)
	FilterDepth uint32
	FilterTid   [FilterTids]int32
	FilterMinNs uint32 // trace only calls lasting at least this (0: any)
	RingReq     uint32 // version 5: the ring size a capture asks for
	RingDef     uint32 // version 5: the size rings start with

	FuncsUsed       uint64
	FuncDropEnters  uint64
	FuncDropExits   uint64
	ThreadsClaimed  uint64
	ThreadsActive   uint64
	ThreadOverflows uint64
	ThreadDropHits  uint64
	PreinitDrops    uint64
	LateDrops       uint64
	FentrySites     uint64
	FentryBadSites  uint64
	FentryUnwound   uint64
	// seccomp (D56): Nosys set by a reader that saw a thread of the
	// process under seccomp; the hooks then make no system call
	Nosys        uint32
	_            uint32
	NosysThreads uint64 // threads whose first hook came under Nosys: not recorded
	NosysSkips   uint64 // in-hook system calls left out under Nosys
	// version 8 (D89): the address, in the process, of its in-flight table
	// (struct ep_inflight, the runtime's own memory), and its capacity; 0:
	// no table (an older runtime)
	Inflight    uint64
	InflightMax uint32
	_           uint32
	_           [199]uint64
	ArgPlan     [ArgPlans]argPlan // version 5
}

// funcEntry is struct ep_func.
type funcEntry struct {
	Addr        uint64 // a copy of the slot's key, written after the claim (the keys array is the table)
	Entries     uint64
	Exits       uint64
	SumNs       uint64
	MinInv      uint64
	MaxNs       uint64
	Orphans     uint64
	Unmatched   uint64
	Hist        [HistBuckets]uint64
	Quota       uint64 // quota epoch << 32 | calls recorded in it (CtlQuota)
	DeepEntries uint64 // entries deeper than the shadow stack (no frame, untimed)
	DeepExits   uint64 // exits of such entries
	Gen         uint64 // a value of Header.Gen, stored before the function's probes are turned on (NewGeneration)
}

// threadSlot is struct ep_thread.
type threadSlot struct {
	State          uint32
	Tid            int32
	Generation     uint32
	Depth          uint32
	ClaimedMono    uint64
	ReentrantDrops uint64
	StackOverflows uint64
	Orphans        uint64
	Unmatched      uint64
	LocalFull      uint64
	RingHead       uint64
	RingDropped    uint64
	RingTailCache  uint64
	Index          uint32
	QuotaBusy      uint32 // 1 from a quota take until the call's enter event is written (D55)
	DeepLost       uint64
	AbandonedHooks uint64
	FentryRestored uint64
	QuotaSkips     uint64
	RingTail       uint64
	HookTicks      uint64
	HookSamples    uint64
	SampleLeft     uint32
	EvGen          uint32 // version 7: the gen of the ring's last DataGen stamp (the owner's, D79)
	FilterOutCg    uint64 // the owner's own verdict on the trace filters (D58): out under this control|gen word
	FilterLimCg    uint64 // under this word, calls at depth FilterLim or deeper are out
	FilterLim      uint32
	_              uint32
	RingSize       uint32 // version 5: events the slot's ring holds now (0: unused)
	_              uint32
}

// localEntry is struct ep_local.
type localEntry struct {
	Addr     uint64
	Gidx     uint32
	Hint     uint32 // the owner's own (histogram bucket of its last latency)
	Entries  uint64
	Exits    uint64
	SumNs    uint64
	FrameIds uint64 // version 6: Gidx | Loff << 32, what a frame stores (the owner's; version 6-8: index + 1 for Loff)
	// Version 9 (D98; a version 5-8 entry ends before it). Parked (D102):
	// frames counted here whose context is suspended in swapcontext, on no
	// thread's shadow stack (zero from runtimes before D102: padding).
	Parked uint64
	_      uint64
}

// frame is struct ep_frame.
type frame struct {
	Fn    uint64
	TS    uint64
	Sp    uint64
	Site  uint64
	Gidx  uint32
	Loff  uint32 // version 9: the cache entry's byte offset in the slot (version 6-8: its index + 1), 0: none
	Gen   uint32
	Flags uint32
}

// event is struct ep_event.
type event struct {
	TSK uint64
	Fn  uint64
}
