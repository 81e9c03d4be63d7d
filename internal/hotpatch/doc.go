// Package hotpatch turns probes on and off in a running process: it finds the
// instrumented objects the process has mapped, matches them to probe lists (or
// scans them), verifies every selected site's live bytes, and hands the sites
// to internal/xmod's protocols, all under a per-process lock.
package hotpatch
