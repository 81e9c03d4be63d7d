package shm

// The constants and structs below mirror runtime/edgeprobe_shm.h exactly
// (TestLayoutMatchesC checks every offset and size against the C compiler).

// Magic is "EDGEPRB1" read as a little-endian uint64.
const Magic uint64 = 0x3142525045474445

// Version is the layout version this package reads.
const Version uint32 = 5

// MinVersion is the oldest layout version this package still reads. Version
// 4 moved the function entry's last histogram buckets (giving the deep-entry
// counters their place) and grew the frame, so older regions are not read.
const MinVersion uint32 = 5

const (
	HeaderSize  = 4096 // bytes of Header
	HistBuckets = 60   // bucket b counts latencies in [2^b, 2^(b+1)) ns; bucket 0 is [0, 2); the last also takes longer ones
	funcSize    = 576
	threadSize  = 192
	localSize   = 48
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

	// FilterTids is how many threads a trace filter can name.
	FilterTids = 8
)

// Event kinds.
const (
	EvEnter  = 0
	EvExit   = 1
	EvThread = 2 // a thread claimed the slot; Event.Addr holds its tid
)

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
	_              uint32
	CalibNs        uint64
	MapsOff        uint64
	MapsLen        uint64
	InitMono       uint64

	State      uint32
	FentryMode uint32
	ExitMono   uint64
	ExitTSC    uint64
	_          [5]uint64

	Control    uint32
	_          [2]uint32 // reserved (the ring size a capture asks for, branch "args")
	Gen        uint32    // process-wide generation: NewGeneration adds 1 and stores it in each function's Gen
	QuotaK     uint32    // CtlQuota: calls a function may record per quota epoch
	QuotaEpoch uint32    // the current quota epoch
	// CtlFilter: trace events only below FilterDepth (0: any depth) and of
	// the threads in FilterTid (first 0: every thread)
	FilterDepth uint32
	FilterTid   [FilterTids]int32
	_           [1]uint32

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
	_               [460]uint64
}

// funcEntry is struct ep_func.
type funcEntry struct {
	Addr        uint64
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
	_              uint32
	DeepLost       uint64
	AbandonedHooks uint64
	FentryRestored uint64
	QuotaSkips     uint64
	RingTail       uint64
	HookTicks      uint64
	HookSamples    uint64
	SampleLeft     uint32
	_              uint32
	_              [4]uint64
}

// localEntry is struct ep_local.
type localEntry struct {
	Addr    uint64
	Gidx    uint32
	Hint    uint32 // the owner's own (histogram bucket of its last latency)
	Entries uint64
	Exits   uint64
	SumNs   uint64
	_       uint64
}

// frame is struct ep_frame.
type frame struct {
	Fn   uint64
	TS   uint64
	Sp   uint64
	Site uint64
	Gidx uint32
	Lidx uint32
	Gen  uint32
	Pad  uint32
}

// event is struct ep_event.
type event struct {
	TSK uint64
	Fn  uint64
}
