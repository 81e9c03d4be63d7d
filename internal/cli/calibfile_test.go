package cli

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/calibrate"
	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestCalibrationFileOwner: the calibration file (EDGEPROBE_CALIBRATION, or
// /tmp/.local/state for a user without a home) in a sticky directory
// everyone writes. Another user's FIFO there held every int3 or auto
// hotpatch in the open (before the lock, but for ever), and another user's
// file chose the int3 wait; both are now refused in one line, and only our
// own file (or root's) is read: an invalid one of ours is still reported as
// invalid. Each run is bounded (10 s), so a hang fails the test.
func TestCalibrationFileOwner(t *testing.T) {
	other := testutil.OtherUser(t)
	dir := testutil.StickyDir(t, "edgeprobe-calib-")
	fifo, theirs, ours := filepath.Join(dir, "fifo"), filepath.Join(dir, "theirs.json"), filepath.Join(dir, "ours.json")
	other.Run(t, "mkfifo", fifo)
	other.Run(t, "sh", "-c", `echo '{}' > "$0"`, theirs)
	if err := os.WriteFile(ours, []byte("{}\n"), 0o644); err != nil {
		t.Fatal(err)
	}
	run := func(path string) outcome {
		t.Helper()
		t.Setenv(calibrate.EnvPath, path)
		done := make(chan outcome, 1)
		go func() { done <- runHotpatch("--pid", "99999999", "--protocol", "int3", "--enable", "work") }()
		select {
		case o := <-done:
			return o
		case <-time.After(10 * time.Second):
			t.Fatalf("calibration %s: hotpatch still running after 10 s (in the open)", path)
			return outcome{}
		}
	}
	oneLineError(t, run(fifo), ExitFailure, "hotpatch", "owned by another user")
	oneLineError(t, run(theirs), ExitFailure, "hotpatch", "owned by another user")
	oneLineError(t, run(ours), ExitFailure, "hotpatch", "invalid calibration")
}
