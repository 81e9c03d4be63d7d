package xmod

import "unsafe"

// SameStates reports whether a and b hold the same states, with one
// memequal: a 40,000-site batch compares its read after with the asked
// states, and a loop over them cost a tenth of the Go side of a batch.
func SameStates(a, b []State) bool {
	if len(a) != len(b) {
		return false
	}
	if len(a) == 0 {
		return true
	}
	// State is a byte: the slices' storage as strings, compared by the
	// runtime's memequal.
	return unsafe.String((*byte)(unsafe.Pointer(&a[0])), len(a)) == unsafe.String((*byte)(unsafe.Pointer(&b[0])), len(b))
}
