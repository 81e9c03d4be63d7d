// Package procfs is edgeprobe's one reader of /proc/PID/stat and
// /proc/PID/status (and their per-thread copies under task/), and the home of
// the one ErrNoProcess every package wraps (ptrace and procmaps re-export
// it). Callers used to carry their own parsers: each got the command-name
// field (which may hold spaces and parentheses) right in its own way, or not.
package procfs
