package testutil

import (
	"os"
	"os/exec"
	"os/user"
	"strconv"
	"syscall"
	"testing"
)

// OtherUserName is the unprivileged local account the hostile-neighbour tests
// act as: another user on the same machine who plants files, tries to read
// our data or to block our tools. .ci/run creates it; OtherUser creates it
// too when the tests run as root and it is missing.
const OtherUserName = "edgeprobe-other"

// Other is a second local user: its ids, and a way to run commands as it.
type Other struct {
	Name     string
	UID, GID uint32
}

// OtherUser returns the hostile neighbour, creating the account (as root) if
// needed; without root or without the account it ends the test (Unavailable).
func OtherUser(t testing.TB) Other {
	t.Helper()
	RequireRoot(t, "acts as a second local user")
	u, err := user.Lookup(OtherUserName)
	if err != nil {
		out, uerr := exec.Command("useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OtherUserName).CombinedOutput()
		if uerr != nil {
			Unavailable(t, "cannot create user %s: %v: %s", OtherUserName, uerr, out)
		}
		if u, err = user.Lookup(OtherUserName); err != nil {
			Unavailable(t, "user %s: %v", OtherUserName, err)
		}
	}
	uid, _ := strconv.ParseUint(u.Uid, 10, 32)
	gid, _ := strconv.ParseUint(u.Gid, 10, 32)
	return Other{Name: u.Username, UID: uint32(uid), GID: uint32(gid)}
}

// Command returns cmd set to run as this user (no supplementary groups).
func (o Other) Command(name string, args ...string) *exec.Cmd {
	cmd := exec.Command(name, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Credential: &syscall.Credential{Uid: o.UID, Gid: o.GID, Groups: []uint32{}}}
	return cmd
}

// Run runs a command as this user, bounded as CombinedOutputBound, and ends
// the test if it fails: the neighbour's setup step (plant a file, a link, a
// FIFO) must have happened for the test to mean anything.
func (o Other) Run(t testing.TB, name string, args ...string) {
	t.Helper()
	if out, err := CombinedOutputBound(o.Command(name, args...)); err != nil {
		t.Fatalf("%s %v as %s: %v: %s", name, args, o.Name, err, out)
	}
}

// StickyDir makes a directory like /tmp (mode 1777: everyone writes, only an
// entry's owner removes it), removed with the test: where another user plants
// things next to ours.
func StickyDir(t testing.TB, prefix string) string {
	t.Helper()
	dir, err := os.MkdirTemp("", prefix)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(dir) })
	if err := os.Chmod(dir, 0o777|os.ModeSticky); err != nil {
		t.Fatal(err)
	}
	return dir
}
