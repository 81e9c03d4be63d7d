// Package report turns what the runtime recorded (internal/shm) into what a
// person or a script reads: a per-function stats table or JSON, a Chrome
// trace-event file (Perfetto, chrome://tracing), and a pprof profile.
// Addresses are named from the objects' symbol tables (static functions and
// shared libraries included), then from probe lists, then sub_<address>.
package report
