package procfs

import (
	"errors"
	"os"
	"testing"
)

func TestSelf(t *testing.T) {
	st, err := ReadStat(os.Getpid(), 0)
	if err != nil || st.State == 0 || st.StartTime == 0 {
		t.Fatalf("ReadStat(self) = %+v, %v", st, err)
	}
	if Gone(os.Getpid(), 0) {
		t.Error("Gone(self)")
	}
	s, err := ReadStatus(os.Getpid(), os.Getpid())
	if err != nil || s.Int("Tgid") != os.Getpid() || s.Int("TracerPid") != 0 {
		t.Fatalf("ReadStatus(self) Tgid %d TracerPid %d, %v", s.Int("Tgid"), s.Int("TracerPid"), err)
	}
	const none = 1<<22 - 3 // above the default pid_max
	if _, err := ReadStat(none, 0); !errors.Is(err, ErrNoProcess) {
		t.Errorf("ReadStat(no process) = %v", err)
	}
	if !Gone(none, 0) || TracerPid(none, 0) != -1 {
		t.Error("a missing process is not gone")
	}
}

// TestHasMemory: a running process has an address space; a pid that does
// not exist has none.
func TestHasMemory(t *testing.T) {
	if !HasMemory(os.Getpid()) {
		t.Error("this process has no address space?")
	}
	if HasMemory(1 << 30) {
		t.Error("pid 1<<30 has an address space?")
	}
}
