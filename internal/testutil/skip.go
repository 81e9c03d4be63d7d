package testutil

import (
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"testing"
)

// Environment variables that decide what runs. docs/testing.md lists them.
const (
	// EnvCI is set to true by CI (.ci/run runs as root with CI=true). There a
	// test that cannot run fails instead of skipping: CI installs what the
	// tests need, so a missing tool is a broken CI setup, not a reason.
	EnvCI = "CI"
	// EnvLong turns on the long matrices (`make test-long`).
	EnvLong = "EDGEPROBE_LONG"
)

// InCI reports whether the tests run under CI (CI=true, or any value
// strconv.ParseBool reads as true).
func InCI() bool {
	v, err := strconv.ParseBool(os.Getenv(EnvCI))
	return err == nil && v
}

// Unavailable ends a test that cannot run here: a skip on a developer's
// machine, a failure in CI. Every "cannot run" goes through it, so no test
// silently stops running in CI.
func Unavailable(t testing.TB, format string, args ...any) {
	t.Helper()
	why := fmt.Sprintf(format, args...)
	if InCI() {
		t.Fatalf("cannot run in CI: %s (CI must provide it: see .ci/run)", why)
	}
	t.Skip("skipping: " + why)
}

// OptIn skips a declared opt-in test (a soak, a calibration) unless the
// environment variable env is set, in CI too: such tests are not part of
// `make test`. It returns the variable's value.
func OptIn(t testing.TB, env, what string) string {
	t.Helper()
	v := os.Getenv(env)
	if v == "" {
		t.Skipf("opt-in %s: set %s to run it", what, env)
	}
	return v
}

// Long reports whether the long matrices run (EDGEPROBE_LONG set, as
// `make test-long` does). Tests use it to widen a matrix, not to skip.
func Long() bool { return os.Getenv(EnvLong) != "" }

// RequireTool ends the test (Unavailable) when a program it needs is not
// installed.
func RequireTool(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		Unavailable(t, "%s is not installed (apt-get install -y %s)", name, name)
	}
}

// RequireRoot ends the test (Unavailable) unless it runs as root.
func RequireRoot(t testing.TB, why string) {
	t.Helper()
	if os.Geteuid() != 0 {
		Unavailable(t, "needs root (%s)", why)
	}
}

// RequirePtrace ends the test (Unavailable) unless this process may
// ptrace-attach to its own children: root, or Yama's ptrace_scope at most 1
// with CAP_SYS_PTRACE or a parent relationship. CI runs the tests as root.
func RequirePtrace(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	scope, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err == nil && strings.TrimSpace(string(scope)) >= "2" {
		Unavailable(t, "needs root (kernel.yama.ptrace_scope >= 2 forbids ptrace without it)")
	}
	// Attaching to a sibling (a process we started) needs scope 0 or root.
	if err == nil && strings.TrimSpace(string(scope)) != "0" {
		Unavailable(t, "needs root or kernel.yama.ptrace_scope=0 to attach to a child process")
	}
}
