package calibrate

import (
	"errors"
	"io/fs"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// sample is a saved-able result with a made-up sweep.
func sample() *Result {
	r := &Result{
		Version:         Version,
		Machine:         Machine{CPUModel: "test cpu", Kernel: "6.18", NProc: 2},
		Margin:          3,
		Protocol:        Protocol,
		Threads:         2,
		TogglesPerPoint: 100,
		Date:            "2026-01-02T03:04:05Z",
	}
	for _, w := range []int64{0, 100, 1000} {
		for _, s := range []int{1, 2, 3, 4} {
			r.Sweep = append(r.Sweep, Point{Variant: VariantInt3, WaitNs: w, Split: splitName(s), Site: s, Toggles: 100})
		}
	}
	r.Sweep[1].Failures, r.Sweep[1].Torn = 2, 2 // no wait, split 2|3
	r.choose()
	return r
}

func TestSaveLoadRoundTrip(t *testing.T) {
	r := sample()
	if !r.Safe || r.BaseWaitNs != 100 || r.WaitNs != 300 {
		t.Fatalf("sample: safe %v base %d wait %d", r.Safe, r.BaseWaitNs, r.WaitNs)
	}
	dir := t.TempDir()
	path := filepath.Join(dir, "a", "b", "calibration.json")
	if err := r.Save(path); err != nil {
		t.Fatal(err)
	}
	st, err := os.Stat(path)
	if err != nil || st.Mode().Perm() != 0o644 {
		t.Fatalf("saved file: %v %v", st, err)
	}
	ents, _ := os.ReadDir(filepath.Dir(path))
	if len(ents) != 1 {
		t.Errorf("temporary files left: %v", ents)
	}
	d, ok, err := Load(path)
	if err != nil || !ok || d != 300*time.Nanosecond {
		t.Fatalf("Load: %v %v %v", d, ok, err)
	}
	back, err := Read(path)
	if err != nil {
		t.Fatal(err)
	}
	a, _ := r.Marshal()
	b, _ := back.Marshal()
	if string(a) != string(b) {
		t.Errorf("round trip changed the file:\n%s\n%s", a, b)
	}
	// Saving again replaces the file.
	r.WaitNs, r.Margin = 500, 5
	if err := r.Save(path); err != nil {
		t.Fatal(err)
	}
	if d, _, _ := Load(path); d != 500*time.Nanosecond {
		t.Errorf("after second save: %v", d)
	}
}

func TestSaveRefusesUnsafe(t *testing.T) {
	r := sample()
	for i := range r.Sweep {
		if r.Sweep[i].WaitNs == 1000 {
			r.Sweep[i].Failures = 1
		}
	}
	r.choose()
	if r.Safe {
		t.Fatal("failures at the largest wait, yet safe")
	}
	path := filepath.Join(t.TempDir(), "c.json")
	if err := r.Save(path); !errors.Is(err, ErrNoSafeWait) {
		t.Fatalf("Save: %v", err)
	}
	if _, err := os.Stat(path); !errors.Is(err, fs.ErrNotExist) {
		t.Errorf("file written anyway: %v", err)
	}
}

func TestLoadMissing(t *testing.T) {
	path := filepath.Join(t.TempDir(), "none.json")
	d, ok, err := Load(path)
	if d != 0 || ok || err != nil {
		t.Fatalf("Load of a missing file: %v %v %v", d, ok, err)
	}
	_, err = Read(path)
	if !errors.Is(err, ErrNoCalibration) || !errors.Is(err, fs.ErrNotExist) || !strings.Contains(err.Error(), "no calibration at "+path) {
		t.Fatalf("Read of a missing file: %v", err)
	}
}

func TestLoadCorrupt(t *testing.T) {
	good, _ := sample().Marshal()
	for name, data := range map[string]string{
		"empty":      "",
		"garbage":    "\x00\x01not json",
		"truncated":  string(good[:len(good)/2]),
		"array":      "[1,2]",
		"no version": `{"wait_ns": 300}`,
		"version 2":  strings.Replace(string(good), `"version": 1`, `"version": 2`, 1),
		"zero wait":  strings.Replace(string(good), `"wait_ns": 300`, `"wait_ns": 0`, 1),
		"neg wait":   strings.Replace(string(good), `"wait_ns": 300`, `"wait_ns": -5`, 1),
		"huge wait":  strings.Replace(string(good), `"wait_ns": 300`, `"wait_ns": 9000000000`, 1),
		"unknown":    strings.Replace(string(good), `"version": 1`, `"version": 1, "extra": true`, 1),
		"trailing":   string(good) + "{}",
		"not safe":   strings.Replace(string(good), `"safe": true`, `"safe": false`, 1),
		"string":     strings.Replace(string(good), `"wait_ns": 300`, `"wait_ns": "300ns"`, 1),
	} {
		if data == string(good) {
			t.Fatalf("%s: the replacement did not apply", name)
		}
		path := filepath.Join(t.TempDir(), "calibration.json")
		if err := os.WriteFile(path, []byte(data), 0o644); err != nil {
			t.Fatal(err)
		}
		d, ok, err := Load(path)
		if err == nil || ok || d != 0 {
			t.Errorf("%s: Load gave %v %v %v", name, d, ok, err)
			continue
		}
		if !errors.Is(err, ErrBadCalibration) || !strings.Contains(err.Error(), path) {
			t.Errorf("%s: error %q should name the file and say it is invalid", name, err)
		}
	}
	// A directory where the file should be is an error, not "no calibration".
	dir := t.TempDir()
	if _, ok, err := Load(dir); err == nil || ok {
		t.Errorf("Load of a directory: %v %v", ok, err)
	}
}

func TestDefaultPath(t *testing.T) {
	env := func(m map[string]string) func(string) string { return func(k string) string { return m[k] } }
	for _, c := range []struct {
		euid int
		env  map[string]string
		want string
	}{
		{0, nil, SystemPath},
		{0, map[string]string{EnvPath: "/x/c.json"}, "/x/c.json"},
		{1000, map[string]string{EnvPath: "/x/c.json", "XDG_STATE_HOME": "/s"}, "/x/c.json"},
		{1000, map[string]string{"XDG_STATE_HOME": "/s", "HOME": "/h"}, "/s/edgeprobe/calibration.json"},
		{1000, map[string]string{"HOME": "/h"}, "/h/.local/state/edgeprobe/calibration.json"},
		{1000, map[string]string{"XDG_STATE_HOME": "rel", "HOME": "/h"}, "/h/.local/state/edgeprobe/calibration.json"},
	} {
		if got := defaultPath(c.euid, env(c.env)); got != c.want {
			t.Errorf("euid %d env %v: %s, want %s", c.euid, c.env, got, c.want)
		}
	}
	t.Setenv(EnvPath, "/tmp/override.json")
	if DefaultPath() != "/tmp/override.json" {
		t.Errorf("DefaultPath ignores %s", EnvPath)
	}
	// Load("") and Save("") use it.
	path := filepath.Join(t.TempDir(), "env.json")
	t.Setenv(EnvPath, path)
	if err := sample().Save(""); err != nil {
		t.Fatal(err)
	}
	if d, ok, err := Load(""); err != nil || !ok || d != 300*time.Nanosecond {
		t.Errorf("Load(\"\") with %s: %v %v %v", EnvPath, d, ok, err)
	}
}

func TestChoose(t *testing.T) {
	mk := func(perWait map[int64][]int, toggles map[int64]int) *Result {
		r := &Result{Version: Version, Margin: 3, TogglesPerPoint: 10, Protocol: Protocol}
		for w, fails := range perWait {
			for i, f := range fails {
				n := 10
				if tg, ok := toggles[w]; ok {
					n = tg
				}
				r.Sweep = append(r.Sweep, Point{Variant: VariantInt3, WaitNs: w, Split: splitName(i + 1), Site: i + 1, Toggles: n, Failures: f})
			}
		}
		// Controls never take part.
		r.Sweep = append(r.Sweep, Point{Variant: VariantFlip, Split: "1|4", Toggles: 10, Failures: 7},
			Point{Variant: VariantInt3Sync, WaitNs: 5, Split: "1|4", Toggles: 10, Failures: 7})
		r.choose()
		return r
	}
	for _, c := range []struct {
		name    string
		fails   map[int64][]int
		toggles map[int64]int
		base    int64 // 0: not safe
	}{
		{"all clean", map[int64][]int{0: {0, 0}, 100: {0, 0}, 250: {0, 0}}, nil, 100},
		{"clean above 100", map[int64][]int{0: {3, 0}, 100: {0, 1}, 250: {0, 0}, 500: {0, 0}}, nil, 250},
		{"a failure above a clean wait", map[int64][]int{100: {0, 0}, 250: {0, 1}, 500: {0, 0}}, nil, 500},
		{"largest fails", map[int64][]int{100: {0, 0}, 250: {0, 1}}, nil, 0},
		{"only no wait", map[int64][]int{0: {0, 0}}, nil, 0},
		{"too few toggles at the top", map[int64][]int{100: {0, 0}, 250: {0, 0}}, map[int64]int{250: 9}, 0},
		{"too few toggles below", map[int64][]int{100: {0, 0}, 250: {0, 0}}, map[int64]int{100: 9}, 250},
		{"a split missing", map[int64][]int{100: {0}, 250: {0, 0}}, nil, 250},
		{"empty", map[int64][]int{}, nil, 0},
	} {
		r := mk(c.fails, c.toggles)
		if r.Safe != (c.base > 0) || r.BaseWaitNs != c.base || r.WaitNs != 3*c.base {
			t.Errorf("%s: safe %v base %d wait %d, want base %d", c.name, r.Safe, r.BaseWaitNs, r.WaitNs, c.base)
		}
		if r.Safe && (r.BaseToggles != 20 || r.RateBound != 3.0/20) {
			t.Errorf("%s: base toggles %d, bound %v", c.name, r.BaseToggles, r.RateBound)
		}
	}
	// A fractional margin rounds the wait up.
	r := &Result{Margin: 2.5, TogglesPerPoint: 1, Sweep: []Point{{Variant: VariantInt3, WaitNs: 3, Split: "1|4", Toggles: 1}}}
	r.choose()
	if r.WaitNs != 8 {
		t.Errorf("3ns x 2.5 = %d", r.WaitNs)
	}
}

func TestWriteTable(t *testing.T) {
	r := sample()
	r.Sweep = append(r.Sweep, Point{Variant: VariantFlip, Split: "1|4", Site: 1, Toggles: 100},
		Point{Variant: VariantInt3Sync, Split: "1|4", Site: 1, Toggles: 100, Failures: 1, Crashes: 1})
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	out := b.String()
	for _, want := range []string{"split 2|3", "2/100", "1/100!", "none", "100ns", "1µs", "calibrated int3 wait (x3 margin): 300ns", "flip, one byte", "int3 with Sync"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
}

// FuzzParse: the reader never panics, and whatever it accepts is a usable
// calibration that survives a write and a read unchanged.
func FuzzParse(f *testing.F) {
	good, _ := sample().Marshal()
	f.Add(good)
	f.Add([]byte(`{"version":1}`))
	f.Add([]byte(`{"version":1,"safe":true,"wait_ns":300,"base_wait_ns":100,"margin":3,"protocol":"int3-nosync","sweep":null}`))
	f.Add([]byte(`null`))
	f.Fuzz(func(t *testing.T, data []byte) {
		r, err := Parse(data)
		if err != nil {
			if !errors.Is(err, ErrBadCalibration) {
				t.Fatalf("error %v does not wrap ErrBadCalibration", err)
			}
			return
		}
		if r.Wait() <= 0 || r.Wait() > time.Second || !r.Safe {
			t.Fatalf("accepted wait %v safe %v", r.Wait(), r.Safe)
		}
		b, err := r.Marshal()
		if err != nil {
			t.Fatal(err)
		}
		r2, err := Parse(b)
		if err != nil {
			t.Fatalf("re-reading what was accepted: %v\n%s", err, b)
		}
		b2, _ := r2.Marshal()
		if string(b) != string(b2) {
			t.Fatalf("not stable:\n%s\n%s", b, b2)
		}
	})
}
