// Package coldpatch makes every hook site of an ELF object inert and returns
// its probe list: the offline half of edgeprobe (iProbe's ColdPatch).
//
// The rewrite is checked before it is kept: every site's bytes are verified to
// be its active form before the inert form goes over them, the patched image
// is scanned again and must yield the same probes, and the result reaches disk
// through a temporary file and a rename, so a failure leaves the input as it
// was and never a half-written binary.
package coldpatch
