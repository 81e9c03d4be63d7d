package cli

import (
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	"github.com/edgeprobe/edgeprobe/internal/calltrace"
)

// Exit codes. Scripts and CI depend on them; keep them stable.
const (
	ExitOK      = 0 // everything asked for was done
	ExitFailure = 1 // an operation failed; nothing was left half-done
	ExitUsage   = 2 // bad flags or arguments
	ExitNoMatch = 3 // a probe selector matched nothing
	ExitGone    = 4 // the target process does not exist or exited while we worked on it
)

// usageError marks errors in the command line itself.
type usageError struct{ error }

func usagef(format string, args ...any) error {
	return usageError{fmt.Errorf(format, args...)}
}

// codedError carries a specific exit code.
type codedError struct {
	error
	code int
}

// exitCode maps an error to the exit code a script sees.
func exitCode(err error) int {
	var ue usageError
	var ce codedError
	switch {
	case err == nil:
		return ExitOK
	case errors.As(err, &ue):
		return ExitUsage
	case errors.As(err, &ce):
		return ce.code
	}
	return ExitFailure
}

// run executes a cobra command and turns its error into one line on stderr
// and an exit code.
func run(cmd *cobra.Command, args []string, stdout, stderr io.Writer) int {
	cmd.SetArgs(args)
	cmd.SetOut(stdout)
	cmd.SetErr(stderr)
	cmd.SilenceErrors = true
	cmd.SilenceUsage = true
	cmd.SetFlagErrorFunc(func(_ *cobra.Command, err error) error { return usageError{err} })
	err := cmd.Execute()
	if err != nil {
		if strings.HasPrefix(err.Error(), "unknown command") || strings.HasPrefix(err.Error(), "accepts ") ||
			strings.HasPrefix(err.Error(), "requires ") {
			err = usageError{err}
		}
		// One line, and names from the target (symbols, paths) or a trace
		// file cannot drive the terminal.
		msg := calltrace.Printable(strings.ReplaceAll(err.Error(), "\n", "; "))
		fmt.Fprintf(stderr, "%s: %s\n", cmd.Name(), msg)
	}
	return exitCode(err)
}
