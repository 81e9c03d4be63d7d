package calltrace

// Kind is what an Event reports.
type Kind uint8

// Event kinds.
const (
	// Entry: a call began.
	Entry Kind = iota + 1
	// Exit: a call ended.
	Exit
	// Instant: a call began that no exit will close (an entry-only probe,
	// such as clang's __cyg_profile_func_enter_bare).
	Instant
	// Lost: the runtime could not record Count events of the thread here
	// (a full ring). Calls that span the gap may be cut short or unpaired.
	Lost
	// Unloaded: the process unloaded the object Func.Object (dlclose) here:
	// the probes in it went with it, and so do the calls of its functions.
	// The event is the process's (Thread is its id), on no thread's stack.
	Unloaded
)

func (k Kind) String() string {
	switch k {
	case Entry:
		return "entry"
	case Exit:
		return "exit"
	case Instant:
		return "instant"
	case Lost:
		return "lost"
	case Unloaded:
		return "unloaded"
	}
	return "kind?"
}

// Function is a probed function, named once and shared by its events.
type Function struct {
	Addr   uint64 // run-time address: the runtime's key for it
	Name   string // symbol, or sub_<address>
	Object string // path of the object that maps it ("" if unknown)
}

// Event is one thing a thread did.
type Event struct {
	Kind   Kind
	Thread int32  // kernel thread id
	TimeNs uint64 // CLOCK_MONOTONIC, ns
	Func   *Function
	// Args are the recorded arguments of an Entry, in declaration order
	// (nil when the capture did not ask for them).
	Args []Value
	// Ret is the recorded return value of an Exit (nil when not asked for,
	// or the function returns nothing).
	Ret *Value
	// Count is the number of events a Lost event stands for.
	Count uint64
	// Unwound marks an Exit the Matcher made up for a call that never
	// returned normally: an exit of one of its callers, or a Lost gap,
	// closed it (longjmp, an exception, a probe turned off mid-call).
	Unwound bool
	// Open marks an Exit the Matcher made up for a call still running when
	// the capture ended; its time is the thread's last event.
	Open bool
}

// Sink receives a well-formed event stream (see Matcher): per thread, in
// the order the thread produced them, every Exit closing the innermost open
// Entry. Events are only valid during the call; a sink that keeps one
// copies it.
type Sink interface {
	Event(e *Event) error
	// Close is called once after the last event.
	Close() error
}
