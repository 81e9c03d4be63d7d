// Package cli implements the coldpatch and hotpatch commands on top of the
// internal packages; cmd/coldpatch and cmd/hotpatch only call Main.
//
// Conventions shared by both commands: JSON on stdout for scripts, human text
// on stderr, quiet by default, and exit codes a script can trust (see
// ExitCode). Every error is one line, prefixed with the command's name.
package cli
