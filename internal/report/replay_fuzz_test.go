package report

import (
	"bytes"
	"io"
	"testing"
)

// FuzzReplay: replaying any file (a truncated, corrupted or hand-made
// Perfetto trace) into the text view ends in output or an error, never a
// panic or a hang, and its memory is bounded by the file's size.
func FuzzReplay(f *testing.F) {
	var pf bytes.Buffer
	ps, err := NewPerfettoSink(&pf, 5, "fib", nil)
	if err != nil {
		f.Fatal(err)
	}
	feed(&testing.T{}, ps, 42, fibEvents())
	whole := pf.Bytes()
	f.Add(whole)
	for _, n := range []int{1, len(whole) / 3, len(whole) / 2, len(whole) - 1} {
		f.Add(whole[:n])
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		_ = ReplayPerfetto(bytes.NewReader(data), NewTextSink(io.Discard))
	})
}
