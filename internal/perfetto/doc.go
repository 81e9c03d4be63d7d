// Package perfetto writes and reads Perfetto's native trace format: a Trace
// message that is a stream of TracePackets, each length-delimited, encoded
// with the protobuf runtime's wire package (google.golang.org/protobuf/
// encoding/protowire). It knows only what a call trace needs: a track per
// process and per thread (TrackDescriptor), slices and instants on them
// (TrackEvent), interned event and argument names (InternedData), typed
// arguments (DebugAnnotation), and the clock the timestamps are in.
//
// The Writer streams: each event is encoded into a reused buffer and
// written at once, so memory does not grow with the number of events, only
// with the number of distinct names, and that is bounded too (the interning
// state is cleared and rebuilt past a limit, as Perfetto's own SDK does).
// The Reader decodes what the Writer writes (and any trace that uses the
// same messages), for `hotpatch replay` and for the tests.
//
// Field numbers are those of Perfetto's published protos
// (protos/perfetto/trace/trace_packet.proto, track_event/track_event.proto,
// track_event/track_descriptor.proto, track_event/debug_annotation.proto,
// interned_data/interned_data.proto, clock_snapshot.proto); the tests check
// the output with protoc against a copy of those definitions
// (testdata/perfetto_subset.proto).
package perfetto
