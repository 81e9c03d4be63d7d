package perfetto

import "google.golang.org/protobuf/encoding/protowire"

// Field numbers, from Perfetto's published protos (file named per group).
const (
	// trace.proto: Trace
	fTracePacket protowire.Number = 1

	// trace_packet.proto: TracePacket
	fPktTimestamp           protowire.Number = 8
	fPktClockSnapshot       protowire.Number = 6
	fPktTrustedSequenceID   protowire.Number = 10
	fPktTrackEvent          protowire.Number = 11
	fPktInternedData        protowire.Number = 12
	fPktSequenceFlags       protowire.Number = 13
	fPktTracePacketDefaults protowire.Number = 59
	fPktTrackDescriptor     protowire.Number = 60

	// TracePacket.SequenceFlags
	seqIncrementalStateCleared = 1
	seqNeedsIncrementalState   = 2

	// trace_packet_defaults.proto: TracePacketDefaults
	fDefTimestampClockID protowire.Number = 58

	// clock_snapshot.proto: ClockSnapshot, ClockSnapshot.Clock
	fSnapClocks       protowire.Number = 1
	fClockID          protowire.Number = 1
	fClockTimestamp   protowire.Number = 2
	clockMonotonic                     = 3 // builtin_clock.proto: BUILTIN_CLOCK_MONOTONIC
	clockBoottime                      = 6 // BUILTIN_CLOCK_BOOTTIME
	fSnapPrimaryClock protowire.Number = 2

	// track_event.proto: TrackEvent
	fTECategoryIIDs     protowire.Number = 3
	fTEDebugAnnotations protowire.Number = 4
	fTEType             protowire.Number = 9
	fTENameIID          protowire.Number = 10
	fTETrackUUID        protowire.Number = 11
	fTEName             protowire.Number = 23
	typeSliceBegin                       = 1 // TrackEvent.Type
	typeSliceEnd                         = 2
	typeInstant                          = 3

	// track_descriptor.proto: TrackDescriptor
	fTDUUID       protowire.Number = 1
	fTDName       protowire.Number = 2
	fTDProcess    protowire.Number = 3
	fTDThread     protowire.Number = 4
	fTDParentUUID protowire.Number = 5

	// process_descriptor.proto: ProcessDescriptor
	fProcPid  protowire.Number = 1
	fProcName protowire.Number = 6

	// thread_descriptor.proto: ThreadDescriptor
	fThrPid  protowire.Number = 1
	fThrTid  protowire.Number = 2
	fThrName protowire.Number = 5

	// interned_data.proto: InternedData; EventCategory, EventName and
	// DebugAnnotationName all have iid = 1, name = 2
	fIDEventCategories protowire.Number = 1
	fIDEventNames      protowire.Number = 2
	fIDAnnotationNames protowire.Number = 3
	fInternIID         protowire.Number = 1
	fInternName        protowire.Number = 2

	// debug_annotation.proto: DebugAnnotation
	fDANameIID     protowire.Number = 1
	fDABool        protowire.Number = 2
	fDAUint        protowire.Number = 3
	fDAInt         protowire.Number = 4
	fDADouble      protowire.Number = 5
	fDAString      protowire.Number = 6
	fDAPointer     protowire.Number = 7
	fDAName        protowire.Number = 10
	fDADictEntries protowire.Number = 11
)
