package calibrate

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"math"
	"os"
	"path/filepath"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/probelist"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
)

// EnvPath names the environment variable that overrides DefaultPath.
const EnvPath = "EDGEPROBE_CALIBRATION"

// SystemPath is the calibration file of root.
const SystemPath = "/var/lib/edgeprobe/calibration.json"

// ErrNoCalibration: there is no calibration file (Read; Load reports it as
// ok == false instead).
var ErrNoCalibration = errors.New("no calibration")

// ErrBadCalibration: the calibration file exists but is not a valid
// calibration.
var ErrBadCalibration = errors.New("invalid calibration file")

// maxWait bounds a sane calibrated wait.
const maxWait = time.Second

// DefaultPath is where Save writes and Load reads by default:
// $EDGEPROBE_CALIBRATION if set; else, for root, SystemPath; else
// $XDG_STATE_HOME/edgeprobe/calibration.json, with XDG_STATE_HOME
// defaulting to $HOME/.local/state.
func DefaultPath() string { return defaultPath(os.Geteuid(), os.Getenv) }

func defaultPath(euid int, getenv func(string) string) string {
	if p := getenv(EnvPath); p != "" {
		return p
	}
	if euid == 0 {
		return SystemPath
	}
	state := getenv("XDG_STATE_HOME")
	if state == "" || !filepath.IsAbs(state) { // the XDG spec: relative values are ignored
		home := getenv("HOME")
		if home == "" {
			home = os.TempDir()
		}
		state = filepath.Join(home, ".local", "state")
	}
	return filepath.Join(state, "edgeprobe", "calibration.json")
}

// Marshal returns the calibration file's bytes (indented JSON, newline).
func (r *Result) Marshal() ([]byte, error) {
	b, err := json.MarshalIndent(r, "", "  ")
	if err != nil {
		return nil, err
	}
	return append(b, '\n'), nil
}

// Save writes r to path ("" means DefaultPath()), creating its directory,
// atomically (temporary file and rename). It refuses a result without a
// safe wait (ErrNoSafeWait): a calibration file always holds a usable wait.
func (r *Result) Save(path string) error {
	if path == "" {
		path = DefaultPath()
	}
	if !r.Safe || r.WaitNs <= 0 {
		return fmt.Errorf("calibration not saved to %s: %w", path, ErrNoSafeWait)
	}
	if err := r.valid(); err != nil {
		return fmt.Errorf("calibration not saved to %s: %w", path, err)
	}
	b, err := r.Marshal()
	if err != nil {
		return err
	}
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return fmt.Errorf("saving calibration: %w", err)
	}
	if err := probelist.WriteFileAtomic(path, b, 0o644); err != nil {
		return fmt.Errorf("saving calibration to %s: %w", path, err)
	}
	return nil
}

// Parse reads a calibration file's bytes. It is strict: unknown fields,
// another version, trailing data, or a wait that is not a positive duration
// of at most a second are errors wrapping ErrBadCalibration.
func Parse(data []byte) (*Result, error) {
	var head struct {
		Version *int `json:"version"`
	}
	if err := json.Unmarshal(data, &head); err != nil {
		return nil, fmt.Errorf("%w: not a JSON object: %v", ErrBadCalibration, err)
	}
	if head.Version == nil {
		return nil, fmt.Errorf("%w: no version field", ErrBadCalibration)
	}
	if *head.Version != Version {
		return nil, fmt.Errorf("%w: version %d, this edgeprobe reads version %d (run `hotpatch calibrate` again)", ErrBadCalibration, *head.Version, Version)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	var r Result
	if err := dec.Decode(&r); err != nil {
		return nil, fmt.Errorf("%w: %v", ErrBadCalibration, err)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("%w: data after the JSON object", ErrBadCalibration)
	}
	if err := r.valid(); err != nil {
		return nil, err
	}
	return &r, nil
}

// valid checks what Load relies on.
func (r *Result) valid() error {
	switch {
	case r.Version != Version:
		return fmt.Errorf("%w: version %d, want %d", ErrBadCalibration, r.Version, Version)
	case !r.Safe:
		return fmt.Errorf("%w: not marked safe (no wait qualified)", ErrBadCalibration)
	case r.WaitNs <= 0 || r.WaitNs > int64(maxWait):
		return fmt.Errorf("%w: wait_ns %d: want 1..%d", ErrBadCalibration, r.WaitNs, int64(maxWait))
	case r.BaseWaitNs <= 0 || r.BaseWaitNs > r.WaitNs:
		return fmt.Errorf("%w: base_wait_ns %d: want 1..wait_ns (%d)", ErrBadCalibration, r.BaseWaitNs, r.WaitNs)
	case r.Margin < 1 || math.IsNaN(r.Margin) || math.IsInf(r.Margin, 0):
		return fmt.Errorf("%w: margin %v: want at least 1", ErrBadCalibration, r.Margin)
	case r.Protocol != Protocol:
		return fmt.Errorf("%w: protocol %q, want %q", ErrBadCalibration, r.Protocol, Protocol)
	}
	return nil
}

// Read reads the calibration at path ("" means DefaultPath()). A missing
// file is an error wrapping ErrNoCalibration (and fs.ErrNotExist); a file
// that does not parse wraps ErrBadCalibration. Errors name the path.
func Read(path string) (*Result, error) {
	if path == "" {
		path = DefaultPath()
	}
	b, err := readOwned(path)
	if err != nil {
		if errors.Is(err, fs.ErrNotExist) {
			return nil, fmt.Errorf("%w at %s (run `hotpatch calibrate` to make one): %w", ErrNoCalibration, path, fs.ErrNotExist)
		}
		return nil, fmt.Errorf("reading calibration: %w", err)
	}
	r, err := Parse(b)
	if err != nil {
		return nil, fmt.Errorf("calibration file %s: %w", path, err)
	}
	return r, nil
}

// maxFileBytes bounds a calibration file (a few hundred bytes of JSON).
const maxFileBytes = 1 << 20

// readOwned reads the calibration file only if it is ours or root's, a
// regular file or a FIFO (procfs.OpenOwned: another user's link in /tmp is
// not followed), and at most maxFileBytes of it. Its content chooses the
// int3 wait of every hotpatch run that reads it; its path may be in a
// directory others write (EDGEPROBE_CALIBRATION, or /tmp/.local/state for a
// user without a home), where another user's FIFO held every hotpatch in
// the open and a link to /dev/zero was read without end (review8).
func readOwned(path string) ([]byte, error) {
	f, err := procfs.OpenOwned(path)
	if err != nil {
		return nil, err
	}
	defer f.Close()
	b, err := io.ReadAll(io.LimitReader(f, maxFileBytes+1))
	if err == nil && len(b) > maxFileBytes {
		err = fmt.Errorf("%s: more than %d bytes: %w", path, maxFileBytes, ErrBadCalibration)
	}
	return b, err
}

// Load returns the calibrated int3 wait saved at path ("" means
// DefaultPath()) and whether there is one. A missing file is (0, false,
// nil): use xmod.DefaultWait. A file that exists but is unreadable or
// invalid is an error (never silently replaced by the default).
func Load(path string) (time.Duration, bool, error) {
	r, err := Read(path)
	if err != nil {
		if errors.Is(err, ErrNoCalibration) {
			return 0, false, nil
		}
		return 0, false, err
	}
	return r.Wait(), true, nil
}
