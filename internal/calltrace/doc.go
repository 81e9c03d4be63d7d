// Package calltrace is the event model that every trace writer and view
// reads: on which thread, at what time, a call of which function began or
// ended, with which argument and return values. A runtime's own encoding is
// converted into it at one edge (internal/capture), so the writers
// (Perfetto, Chrome JSON, the text call graph) never depend on the runtime's
// layout, and a new encoding plugs in by converting into Event.
//
// Raw events are what a runtime saw, with its irregularities: exits of calls
// that began before the capture, exits that skip frames (longjmp, exceptions),
// calls still running at the end. A Matcher turns them into a well-formed
// stream, where every Exit closes the innermost open Entry of its thread, and
// counts what it had to repair.
package calltrace
