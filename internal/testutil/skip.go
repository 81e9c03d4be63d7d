package testutil

import (
	"os"
	"os/exec"
	"strings"
	"testing"
)

// RequireTool skips the test when a program it needs is not installed.
func RequireTool(t testing.TB, name string) {
	t.Helper()
	if _, err := exec.LookPath(name); err != nil {
		t.Skipf("skipping: %s is not installed (apt-get install -y %s)", name, name)
	}
}

// RequirePtrace skips the test unless this process may ptrace-attach to its
// own children: root, or Yama's ptrace_scope at most 1 with CAP_SYS_PTRACE
// or a parent relationship. CI runs the tests as root.
func RequirePtrace(t testing.TB) {
	t.Helper()
	if os.Geteuid() == 0 {
		return
	}
	scope, err := os.ReadFile("/proc/sys/kernel/yama/ptrace_scope")
	if err == nil && strings.TrimSpace(string(scope)) >= "2" {
		t.Skip("skipping: needs root (kernel.yama.ptrace_scope >= 2 forbids ptrace without it)")
	}
	// Attaching to a sibling (a process we started) needs scope 0 or root.
	if err == nil && strings.TrimSpace(string(scope)) != "0" {
		t.Skip("skipping: needs root or kernel.yama.ptrace_scope=0 to attach to a child process")
	}
}
