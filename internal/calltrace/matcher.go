package calltrace

// MaxDepth is how many open calls a Matcher keeps per thread. Deeper calls
// are passed over (counted in TooDeep) together with their exits, the way
// the runtime's shadow stack does, so memory stays bounded whatever the
// input.
const MaxDepth = 1 << 16

// Matcher turns raw events into a well-formed stream for a Sink.
type Matcher struct {
	sink    Sink
	threads map[int32]*thread
	order   []int32
	// Unpaired counts exits with no open entry on their thread (the call
	// began before the capture, or its entry was lost); they are dropped.
	Unpaired uint64
	// Unwound counts calls closed by an exit of a caller (made-up exits).
	Unwound uint64
	// Open counts calls still running at Close (made-up exits).
	Open uint64
	// TooDeep counts entries passed over beyond MaxDepth (and as many exits).
	TooDeep uint64
	// Calls counts exits passed on, made-up ones included.
	Calls uint64
}

type thread struct {
	stack  []*Function
	deep   int // entries passed over above the stack (see MaxDepth)
	lastNs uint64
}

// NewMatcher passes what it makes well-formed on to sink.
func NewMatcher(sink Sink) *Matcher {
	return &Matcher{sink: sink, threads: map[int32]*thread{}}
}

// Add takes one raw event, in its thread's order.
func (m *Matcher) Add(e *Event) error {
	if e.Kind == Unloaded {
		return m.sink.Event(e) // the process's: no thread's calls change
	}
	th := m.threads[e.Thread]
	if th == nil {
		th = &thread{}
		m.threads[e.Thread] = th
		m.order = append(m.order, e.Thread)
	}
	th.lastNs = e.TimeNs
	switch e.Kind {
	case Entry:
		if len(th.stack) >= MaxDepth {
			th.deep++
			m.TooDeep++
			return nil
		}
		th.stack = append(th.stack, e.Func)
	case Exit:
		if th.deep > 0 {
			th.deep--
			return nil
		}
		i := len(th.stack) - 1
		for i >= 0 && th.stack[i].Addr != e.Func.Addr {
			i--
		}
		if i < 0 {
			m.Unpaired++
			return nil
		}
		// Frames above the match never returned: a longjmp or an exception
		// left them. They end where the caller's exit shows they had ended.
		for j := len(th.stack) - 1; j > i; j-- {
			m.Unwound++
			if err := m.exit(e.Thread, th, j, e.TimeNs, true, false); err != nil {
				return err
			}
		}
		th.stack = th.stack[:i]
		m.Calls++
	}
	return m.sink.Event(e)
}

func (m *Matcher) exit(tid int32, th *thread, j int, ns uint64, unwound, open bool) error {
	m.Calls++
	th.stack = th.stack[:j+1]
	return m.sink.Event(&Event{Kind: Exit, Thread: tid, TimeNs: ns, Func: th.stack[j], Unwound: unwound, Open: open})
}

// Close ends the calls still open, at each thread's last event, then closes
// the sink.
func (m *Matcher) Close() error {
	for _, tid := range m.order {
		th := m.threads[tid]
		for j := len(th.stack) - 1; j >= 0; j-- {
			m.Open++
			if err := m.exit(tid, th, j, th.lastNs, false, true); err != nil {
				return err
			}
		}
		th.stack = nil
	}
	return m.sink.Close()
}

// Depth is the number of open calls on thread tid.
func (m *Matcher) Depth(tid int32) int {
	if th := m.threads[tid]; th != nil {
		return len(th.stack)
	}
	return 0
}
