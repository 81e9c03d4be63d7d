// Package phases is a phase timer for one run of a command: with
// EDGEPROBE_PHASES set, each Mark records the time, the process's CPU time,
// context switches and page faults since the previous mark, and Print
// writes them as a table, which Parse reads back (bench row 6c runs hotpatch
// with the timer on; docs/decisions.md D71 used it to find where a one-shot
// toggle's time goes). Unset, Mark is one load and a
// branch: it costs nothing measurable on the paths it marks.
package phases
