package shm

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"testing"
	"unsafe"
)

// validRegion builds a small, consistent region image in Go.
func validRegion() []byte {
	h := Header{
		Magic: Magic, Version: Version, HeaderSize: HeaderSize, Pid: 42, HistBuckets: HistBuckets,
		ClockKind: ClockMono, TSCMult: 1 << 32, MaxFuncs: 4, FuncFirst: 2, FuncSegs: 2, FuncSize: funcSize,
		MaxThreads: 2, ThreadLocalOff: threadSize, LocalFuncs: 2, LocalSize: localSize,
		ThreadStackOff: 320, StackDepth: 4, FrameSize: frameSize, RingEvents: 4, EventSize: eventSize,
		RingStride: 64, MaxProbe: 2, State: StateExited,
	}
	h.ThreadSize = 512 // 320 + 4*frameSize = 512, a multiple of 64
	h.ThreadOff = HeaderSize
	h.RingOff = h.ThreadOff + 2*uint64(h.ThreadSize)
	h.KeysOff = h.RingOff + 2*h.RingStride
	h.FuncOff = h.KeysOff + 64
	h.RegionSize = h.FuncOff + 4*funcSize
	b := make([]byte, h.RegionSize)
	*(*Header)(unsafe.Pointer(&b[0])) = h
	return b
}

func TestParseHeaderValid(t *testing.T) {
	b := validRegion()
	h, err := ParseHeader(b)
	if err != nil {
		t.Fatal(err)
	}
	if h.Pid != 42 || h.MaxFuncs != 4 {
		t.Errorf("parsed %+v", h)
	}
}

func TestParseHeaderErrors(t *testing.T) {
	put32 := func(off int, v uint32) func([]byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint32(b[off:], v); return b }
	}
	put64 := func(off int, v uint64) func([]byte) []byte {
		return func(b []byte) []byte { binary.LittleEndian.PutUint64(b[off:], v); return b }
	}
	off := func(f string) int {
		typ := unsafe.Sizeof(Header{})
		_ = typ
		switch f {
		case "version":
			return int(unsafe.Offsetof(Header{}.Version))
		case "max_funcs":
			return int(unsafe.Offsetof(Header{}.MaxFuncs))
		case "func_size":
			return int(unsafe.Offsetof(Header{}.FuncSize))
		case "thread_off":
			return int(unsafe.Offsetof(Header{}.ThreadOff))
		case "ring_stride":
			return int(unsafe.Offsetof(Header{}.RingStride))
		case "region_size":
			return int(unsafe.Offsetof(Header{}.RegionSize))
		case "max_threads":
			return int(unsafe.Offsetof(Header{}.MaxThreads))
		case "maps_len":
			return int(unsafe.Offsetof(Header{}.MapsLen))
		case "clock_kind":
			return int(unsafe.Offsetof(Header{}.ClockKind))
		case "func_first":
			return int(unsafe.Offsetof(Header{}.FuncFirst))
		case "func_segs":
			return int(unsafe.Offsetof(Header{}.FuncSegs))
		case "max_probe":
			return int(unsafe.Offsetof(Header{}.MaxProbe))
		case "keys_off":
			return int(unsafe.Offsetof(Header{}.KeysOff))
		}
		panic(f)
	}
	for _, tc := range []struct {
		name string
		mod  func([]byte) []byte
		want error
	}{
		{"short", func(b []byte) []byte { return b[:100] }, ErrTruncated},
		{"magic", put64(0, 0x1234), ErrBadMagic},
		{"version", put32(off("version"), 99), ErrVersion},
		{"not-pow2", put32(off("max_funcs"), 3), ErrLayout},
		{"func-size", put32(off("func_size"), 512), ErrLayout},
		{"overlap", put64(off("thread_off"), HeaderSize+64), ErrLayout},
		{"ring-stride", put64(off("ring_stride"), 8), ErrLayout},
		{"region-size", put64(off("region_size"), 1<<40), ErrTruncated},
		{"threads-overflow", put32(off("max_threads"), math.MaxUint32), ErrLayout},
		{"maps-outside", put64(off("maps_len"), 10), ErrLayout},
		{"clock", put32(off("clock_kind"), 7), ErrLayout},
		{"first-not-pow2", put32(off("func_first"), 3), ErrLayout},
		{"first-above-max", put32(off("func_first"), 8), ErrLayout},
		{"segs-zero", put32(off("func_segs"), 0), ErrLayout},
		{"segs-beyond-cap", put32(off("func_segs"), 3), ErrLayout},
		{"probe-beyond-first", put32(off("max_probe"), 4), ErrLayout},
		{"keys-overlap-rings", put64(off("keys_off"), HeaderSize+1024), ErrLayout},
		{"truncated-tables", func(b []byte) []byte { return b[:len(b)-1] }, ErrTruncated},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseHeader(tc.mod(validRegion()))
			if !errors.Is(err, tc.want) {
				t.Errorf("got %v, want %v", err, tc.want)
			}
		})
	}
}

// FuzzParseHeader: any input is rejected with an error or accepted with a
// geometry whose every table lies inside the input; the reader's accessors
// must then stay in bounds.
func FuzzParseHeader(f *testing.F) {
	f.Add(validRegion())
	f.Add(make([]byte, HeaderSize))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := ParseHeader(b)
		if err != nil {
			return
		}
		r := &Region{mem: b, hdr: h}
		r.Functions()
		r.Threads()
		r.Counters()
		r.Maps()
		r.FuncSlots()
		r.lookup(1)
		r.lookup(0x4011d6)
		for i := 0; i < int(h.MaxThreads) && i < 8; i++ {
			r.Events(i)
		}
	})
}

// TestLocalStrideByVersion: a thread cache entry is 48 bytes up to version 8
// and 64 from version 9 (D98). A header must give its version's size, and
// Functions must step through the caches by it: an entry read at the other
// stride would drop the counts it holds (or read a neighbour's).
func TestLocalStrideByVersion(t *testing.T) {
	const key = 0x401136
	for _, tc := range []struct {
		version, size uint32
		want          error
	}{
		{8, localSizeV8, nil}, {9, localSize, nil}, {8, localSize, ErrLayout}, {9, localSizeV8, ErrLayout},
	} {
		t.Run(fmt.Sprintf("v%d-%d", tc.version, tc.size), func(t *testing.T) {
			b := validRegion()
			hp := (*Header)(unsafe.Pointer(&b[0]))
			hp.Version, hp.LocalSize = tc.version, tc.size
			h, err := ParseHeader(b)
			if !errors.Is(err, tc.want) {
				t.Fatalf("ParseHeader: %v, want %v", err, tc.want)
			}
			if err != nil {
				return
			}
			r := &Region{mem: b, hdr: h}
			*r.keyAt(0) = key
			r.funcAt(0).Entries = 1
			r.slotAt(1).Generation = 1
			l := r.localAt(1, 1) // the second entry: its offset depends on the stride
			l.Addr, l.Gidx, l.Entries = key, 0, 5
			off := h.ThreadOff + uint64(h.ThreadSize) + threadSize + uint64(tc.size)
			if got := binary.LittleEndian.Uint64(b[off:]); got != key {
				t.Fatalf("the entry was written at %#x, want the version's stride (%d bytes): key there %#x", uintptr(unsafe.Pointer(l))-uintptr(unsafe.Pointer(&b[0])), tc.size, got)
			}
			fs := r.Functions()
			if len(fs) != 1 || fs[0].Entries != 6 {
				t.Fatalf("Functions: %+v, want one function with 1 + 5 entries", fs)
			}
		})
	}
}
