package testjson

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// The testdata files are real `go test -json` output (go 1.26) of a few
// tiny packages, paths shortened:
//
//	mixed.json: a/ TestA passes with a passing and a skipped subtest, TestB
//	  logs then fails; b/ does not compile; c/ TestD calls os.Exit(3);
//	  e/ has no test files.
//	timeout.json: d/ TestSlow sleeps past `go test -timeout 1s`.
func tally(t *testing.T, file string) (*Tally, string) {
	t.Helper()
	f, err := os.Open("testdata/" + file)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var log, raw bytes.Buffer
	tl := NewTally(&log)
	if err := tl.Read(f, &raw); err != nil {
		t.Fatal(err)
	}
	want, _ := os.ReadFile("testdata/" + file)
	if !bytes.Equal(raw.Bytes(), want) {
		t.Errorf("the raw copy differs from the input")
	}
	return tl, log.String()
}

func TestMixed(t *testing.T) {
	tl, log := tally(t, "mixed.json")
	// TestA, TestA/s1 pass; TestA/s2 skips; TestB fails; x/b fails to build
	// (one failure for the package); TestD never ends (one failure).
	if got, want := tl.Counts().String(), "2 passed, 3 failed, 1 skipped"; got != want {
		t.Errorf("counts %q, want %q", got, want)
	}
	if tl.MalformedLines() != 0 {
		t.Errorf("%d malformed lines", tl.MalformedLines())
	}
	for _, want := range []string{
		"SKIP x/a TestA/s2: nope\n",
		"    a_test.go:4: hello\n    a_test.go:4: bad\n--- FAIL: TestB (0.00s)\n", // a failed test's whole output
		"b/b_test.go:3:27: declared and not used: x\n",                            // the build error
		"FAIL\tx/b [build failed]\n",
		"=== RUN   TestD\n--- FAIL: TestD (never finished)\n",
	} {
		if !strings.Contains(log, want) {
			t.Errorf("log lacks %q:\n%s", want, log)
		}
	}
	if strings.Contains(log, "TestA/s1") {
		t.Errorf("a passing test's output was printed:\n%s", log)
	}
	if strings.Contains(log, "x/e") {
		t.Errorf("a package without tests was reported:\n%s", log)
	}
	pk, ts := tl.Slowest(2)
	if len(pk) != 2 || len(ts) != 2 || pk[0].Seconds < pk[1].Seconds {
		t.Errorf("slowest: %v %v", pk, ts)
	}
}

func TestTimeout(t *testing.T) {
	tl, log := tally(t, "timeout.json")
	if got, want := tl.Counts().String(), "0 passed, 1 failed, 0 skipped"; got != want {
		t.Errorf("counts %q, want %q", got, want)
	}
	if !strings.Contains(log, "panic: test timed out after 1s") {
		t.Errorf("the timeout's panic is not in the log:\n%s", log)
	}
}

func TestNotJSON(t *testing.T) {
	var log bytes.Buffer
	tl := NewTally(&log)
	in := "go: cannot find main module\n" + `{"Action":"pass","Package":"p","Test":"T"}` + "\n"
	if err := tl.Read(strings.NewReader(in), nil); err != nil {
		t.Fatal(err)
	}
	if tl.MalformedLines() != 1 || !strings.Contains(log.String(), "cannot find main module") {
		t.Errorf("malformed %d, log %q", tl.MalformedLines(), log.String())
	}
	if tl.Counts() != (Counts{Passed: 1}) {
		t.Errorf("counts %v", tl.Counts())
	}
}
