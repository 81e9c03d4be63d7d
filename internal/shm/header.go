package shm

import (
	"errors"
	"fmt"
	"math/bits"
	"unsafe"
)

// Errors a malformed region wraps; test with errors.Is.
var (
	ErrTruncated = errors.New("shm: region truncated")
	ErrBadMagic  = errors.New("shm: not an edgeprobe region (bad magic)")
	ErrVersion   = errors.New("shm: unsupported layout version")
	ErrLayout    = errors.New("shm: inconsistent region layout")
	ErrReadOnly  = errors.New("shm: region opened read-only")
	ErrNoSlot    = errors.New("shm: no such thread slot")
	ErrArgPlans  = errors.New("shm: cannot record these arguments")
	ErrRingSize  = errors.New("shm: ring size not available")
)

func layoutErr(field string, v uint64, why string) error {
	return fmt.Errorf("header field %s = %d: %s: %w", field, v, why, ErrLayout)
}

// ParseHeader decodes and validates the header at the start of data, a whole
// region or output file: every table it describes must lie inside data, not
// overlap the others, and use the record sizes this package knows.
func ParseHeader(data []byte) (Header, error) {
	var h Header
	if len(data) < HeaderSize {
		return h, fmt.Errorf("%d bytes, need at least %d for the header: %w", len(data), HeaderSize, ErrTruncated)
	}
	h = *(*Header)(unsafe.Pointer(&data[0]))
	if h.Magic != Magic {
		return h, fmt.Errorf("magic %#x, want %#x: %w", h.Magic, Magic, ErrBadMagic)
	}
	if h.Version < MinVersion || h.Version > Version {
		return h, fmt.Errorf("version %d, this reader knows %d..%d: %w", h.Version, MinVersion, Version, ErrVersion)
	}
	return h, h.validate(uint64(len(data)))
}

// localSize is the size of a thread cache entry in this header's version.
func (h *Header) localSize() uint64 {
	if h.Version < 9 {
		return localSizeV8
	}
	return localSize
}

func (h *Header) validate(size uint64) error {
	for _, f := range []struct {
		name     string
		got, exp uint64
	}{
		{"header_size", uint64(h.HeaderSize), HeaderSize},
		{"hist_buckets", uint64(h.HistBuckets), HistBuckets},
		{"func_size", uint64(h.FuncSize), funcSize},
		{"local_size", uint64(h.LocalSize), h.localSize()},
		{"frame_size", uint64(h.FrameSize), frameSize},
		{"event_size", uint64(h.EventSize), eventSize},
		{"thread_local_off", uint64(h.ThreadLocalOff), threadSize},
	} {
		if f.got != f.exp {
			return layoutErr(f.name, f.got, fmt.Sprintf("want %d", f.exp))
		}
	}
	if h.ClockKind != ClockTSC && h.ClockKind != ClockMono {
		return layoutErr("clock_kind", uint64(h.ClockKind), "unknown clock")
	}
	if h.TSCMult == 0 {
		return layoutErr("tsc_mult", 0, "zero")
	}
	if h.RegionSize > size {
		return fmt.Errorf("header field region_size = %d but only %d bytes: %w", h.RegionSize, size, ErrTruncated)
	}
	pow2 := func(name string, v uint32, zeroOK bool) error {
		if v == 0 && zeroOK {
			return nil
		}
		if v == 0 || v&(v-1) != 0 {
			return layoutErr(name, uint64(v), "not a power of two")
		}
		return nil
	}
	if err := pow2("max_funcs", h.MaxFuncs, false); err != nil {
		return err
	}
	if err := pow2("local_funcs", h.LocalFuncs, true); err != nil {
		return err
	}
	if err := pow2("ring_events", h.RingEvents, true); err != nil {
		return err
	}
	if h.MaxThreads == 0 {
		return layoutErr("max_threads", 0, "zero")
	}
	if h.StackDepth == 0 {
		return layoutErr("stack_depth", 0, "zero")
	}
	if err := pow2("func_first", h.FuncFirst, false); err != nil {
		return err
	}
	if h.FuncFirst > h.MaxFuncs {
		return layoutErr("func_first", uint64(h.FuncFirst), "more than max_funcs")
	}
	if h.MaxProbe == 0 || h.MaxProbe > h.FuncFirst {
		return layoutErr("max_probe", uint64(h.MaxProbe), "outside [1, func_first]")
	}
	if h.FuncSegs == 0 || h.FuncSegs > h.funcSegsMax() {
		return layoutErr("func_segs", uint64(h.FuncSegs), fmt.Sprintf("outside [1, %d]", h.funcSegsMax()))
	}
	// A thread slot: fixed part, local cache, stack, in that order.
	localEnd := uint64(threadSize) + uint64(h.LocalFuncs)*h.localSize()
	if uint64(h.ThreadStackOff) < localEnd || h.ThreadStackOff%8 != 0 {
		return layoutErr("thread_stack_off", uint64(h.ThreadStackOff), "overlaps the local cache or misaligned")
	}
	if uint64(h.ThreadSize) < uint64(h.ThreadStackOff)+uint64(h.StackDepth)*frameSize || h.ThreadSize%64 != 0 {
		return layoutErr("thread_size", uint64(h.ThreadSize), "smaller than its stack or not a multiple of 64")
	}
	if h.RingStride < uint64(h.RingEvents)*eventSize || h.RingStride%8 != 0 {
		return layoutErr("ring_stride", h.RingStride, "smaller than ring_events events or misaligned")
	}
	// Sections in order, inside the region, 64-byte aligned.
	type sec struct {
		name    string
		off     uint64
		n, each uint64
	}
	prev := uint64(HeaderSize)
	for _, s := range []sec{
		{"thread_off", h.ThreadOff, uint64(h.MaxThreads), uint64(h.ThreadSize)},
		{"ring_off", h.RingOff, uint64(h.MaxThreads), h.RingStride},
		{"keys_off", h.KeysOff, uint64(h.MaxFuncs), 8},
		{"func_off", h.FuncOff, uint64(h.MaxFuncs), funcSize},
	} {
		if s.off < prev || s.off%64 != 0 {
			return layoutErr(s.name, s.off, "overlaps the previous section or misaligned")
		}
		hi, n := bits.Mul64(s.n, s.each)
		end, carry := bits.Add64(s.off, n, 0)
		if hi != 0 || carry != 0 || end > h.RegionSize {
			return layoutErr(s.name, s.off, fmt.Sprintf("table of %d x %d bytes runs past region_size %d", s.n, s.each, h.RegionSize))
		}
		prev = end
	}
	if h.MapsLen != 0 || h.MapsOff != 0 {
		end, carry := bits.Add64(h.MapsOff, h.MapsLen, 0)
		if h.MapsOff < h.RegionSize || carry != 0 || end > size {
			return layoutErr("maps_off", h.MapsOff, fmt.Sprintf("maps copy of %d bytes outside the file", h.MapsLen))
		}
	}
	return nil
}

// funcSegsMax is the number of function-table segments up to MaxFuncs:
// segment 0 holds FuncFirst slots, segment k >= 1 FuncFirst<<(k-1), so
// MaxFuncs = FuncFirst<<(segments-1). Both are powers of two (validate).
func (h *Header) funcSegsMax() uint32 {
	if h.FuncFirst == 0 || h.MaxFuncs < h.FuncFirst {
		return 0
	}
	return uint32(bits.Len32(h.MaxFuncs / h.FuncFirst))
}
