package ptrace

import (
	"strings"
	"testing"
)

// A refused attach names what it needs under each Yama ptrace_scope (this
// kernel may have no Yama: the live case is the same EPERM path as
// TestOtherUser's).
func TestPermissionHint(t *testing.T) {
	for _, c := range []struct {
		scope string
		euid  int
		want  string
	}{
		{"", 1000, "needs root or CAP_SYS_PTRACE"},
		{"0", 1000, "needs root or CAP_SYS_PTRACE"},
		{"1", 1000, "ptrace_scope is 1: needs root or CAP_SYS_PTRACE"},
		{"1", 0, "needs root or CAP_SYS_PTRACE"},
		{"2", 0, "ptrace_scope is 2: needs CAP_SYS_PTRACE"},
		{"3", 0, "ptrace_scope is 3: no process may be traced, not even by root, until a reboot"},
	} {
		got := permissionHint(c.scope, c.euid)
		if !strings.HasSuffix(got, c.want) || strings.Contains(got, "\n") {
			t.Errorf("scope %q euid %d: %q, want it to end %q", c.scope, c.euid, got, c.want)
		}
	}
}
