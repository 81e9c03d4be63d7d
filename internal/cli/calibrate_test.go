package cli

import (
	"bytes"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestInt3Wait: the calibrated wait is used when one is saved; a corrupt
// file fails an explicit int3 request but only warns for auto, which may
// not need int3 at all; flip and stop never read the file.
func TestInt3Wait(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "calibration.json")
	t.Setenv("EDGEPROBE_CALIBRATION", path)

	var warn bytes.Buffer
	if d, err := int3Wait("int3", &warn); err != nil || d != 0 {
		t.Fatalf("no calibration: %v, %v; want the default (0)", d, err)
	}

	os.WriteFile(path, []byte("{not json"), 0o644)
	if _, err := int3Wait("int3", &warn); err == nil || !strings.Contains(err.Error(), "hotpatch calibrate") {
		t.Errorf("corrupt file with --protocol int3: %v; want an error pointing at hotpatch calibrate", err)
	}
	warn.Reset()
	if d, err := int3Wait("auto", &warn); err != nil || d != 0 || !strings.Contains(warn.String(), "warning") {
		t.Errorf("corrupt file with auto: %v, %v, stderr %q; want a warning and the default", d, err, warn.String())
	}
	for _, p := range []string{"flip", "stop"} {
		if d, err := int3Wait(p, &warn); err != nil || d != 0 {
			t.Errorf("%s read the calibration: %v, %v", p, d, err)
		}
	}
}

// TestCalibrateSaved: a real (tiny) calibration saves a wait that int3Wait
// then returns. Needs ptrace rights, like every calibration.
func TestCalibrateSaved(t *testing.T) {
	testutil.RequireRoot(t, "calibration ptraces the bundled target")
	path := filepath.Join(t.TempDir(), "cal.json")
	t.Setenv("EDGEPROBE_CALIBRATION", path)
	o := runHotpatch("calibrate", "--waits", "0,1us", "--toggles", "40")
	if o.code != ExitOK {
		t.Fatalf("calibrate: exit %d: %s", o.code, o.stderr)
	}
	if !strings.Contains(o.stdout, "saved to "+path) {
		t.Errorf("output does not say where it saved: %q", o.stdout)
	}
	d, err := int3Wait("int3", &bytes.Buffer{})
	if err != nil || d != 3*time.Microsecond {
		t.Errorf("int3Wait after calibrating = %v, %v; want 3µs (1µs x the 3x margin)", d, err)
	}
}
