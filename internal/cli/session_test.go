package cli

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
	"testing/iotest"
)

// TestSessionUsage: a session that cannot start says why in one line, with
// the usage exit code, and prints no result.
func TestSessionUsage(t *testing.T) {
	oneLineError(t, runHotpatch("session"), ExitUsage, "hotpatch", "--pid is required")
	oneLineError(t, runHotpatch("session", "--pid", "1", "--protocol", "teleport"), ExitUsage, "hotpatch", "--protocol must be")
	oneLineError(t, runHotpatch("--pid", "1", "--commands", "-", "--enable", "f"), ExitUsage, "hotpatch", "--commands takes its enables")
	oneLineError(t, runHotpatch("--pid", "999999999", "--commands", "/nonexistent/commands"), ExitFailure, "hotpatch", "no such file")
	oneLineError(t, runHotpatch("session", "--pid", "999999999"), ExitGone, "hotpatch", "no such process")
}

// TestParseActions: a command line's selectors and options, as hotpatch's
// flags read them; bad options are usage errors.
func TestParseActions(t *testing.T) {
	a, err := parseActions(true, []string{"f", "g*", "--kind", "entry", "--provider=cyg"})
	if err != nil {
		t.Fatal(err)
	}
	if len(a) != 2 || !a[0].Enable || a[0].Selector.Pattern != "f" || a[1].Selector.Pattern != "g*" {
		t.Fatalf("actions %+v", a)
	}
	for _, x := range a {
		if x.Selector.Kind != "entry" || x.Selector.Provider != "cyg" {
			t.Fatalf("options not applied to every selector: %+v", a)
		}
	}
	b, err := parseActions(false, []string{"--kind=entry", "g*", "f"})
	if err != nil || b[0].Enable || b[1].Selector.Kind != "entry" {
		t.Fatalf("options before selectors: %+v, %v", b, err)
	}
	if reflect.DeepEqual(a, b) {
		t.Fatal("enable and disable parsed alike")
	}
	for _, bad := range [][]string{{}, {"--kind"}, {"f", "--kind", "sideways"}, {"f", "--frob"}, {"f", "--provider", "dtrace"}} {
		if _, err := parseActions(true, bad); exitCode(err) != ExitUsage {
			t.Errorf("parseActions(%q) = %v, want a usage error", bad, err)
		}
	}
}

// FuzzSessionLine: no command line crashes the parser; what it accepts has a
// selector per action and the options the line gave.
func FuzzSessionLine(f *testing.F) {
	for _, s := range []string{"enable f", "disable f* g --kind exit", "enable --provider=fentry id:3", "enable --kind", "disable", "enable \x00 --kind=both"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, line string) {
		fields := strings.Fields(line)
		if len(fields) == 0 {
			return
		}
		a, err := parseActions(fields[0] == "enable", fields[1:])
		if err != nil {
			if exitCode(err) != ExitUsage {
				t.Fatalf("%q: %v is not a usage error", line, err)
			}
			return
		}
		if len(a) == 0 {
			t.Fatalf("%q: accepted with no action", line)
		}
		for _, x := range a {
			if x.Selector.Pattern == "" {
				t.Fatalf("%q: an action without a selector: %+v", line, a)
			}
		}
	})
}

// TestSessionResultJSON: the hand-written encoding of a plain result is
// byte for byte what json.Marshal writes, and every other result goes
// through json.Marshal.
func TestSessionResultJSON(t *testing.T) {
	n, ns := 3, int64(99)
	for _, r := range []sessionResult{
		{Line: 1, OK: true, Command: "enable", Changed: 2, ElapsedNS: 1234},
		{Line: 1 << 40, OK: true, Command: "disable", Unchanged: 7, ElapsedNS: -1},
		{Line: 0, OK: true, Command: "enable"},
		{Line: 5, OK: false, Command: "enable", Error: "no \"probe\" <matches>\n", Exit: 3},
		{Line: 6, OK: true, Command: "stats", Commands: &n, Toggles: &n, Errors: &n, SessionNS: &ns},
		{Line: 7, OK: true, Command: "enable", Changed: 1, Warnings: []string{"a writer"}},
		{Line: 8, OK: true, Command: "enab\u2028le"},
		{Line: 9, OK: true, Command: "quit"},
	} {
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.appendJSON([]byte("prefix"))
		if err != nil || string(got) != "prefix"+string(want) {
			t.Errorf("%+v:\n got %s (%v)\nwant prefix%s", r, got, err, want)
		}
	}
}

// FuzzSessionResultJSON: whatever a result holds, appendJSON writes what
// json.Marshal writes.
func FuzzSessionResultJSON(f *testing.F) {
	f.Add(1, true, "enable", 2, 0, int64(1234), "", 0)
	f.Add(7, true, "disable", 0, 9, int64(-5), "", 0)
	f.Add(3, false, "enable", 0, 0, int64(0), "no probe matched \"x\"", 3)
	f.Add(4, true, "enab\u2028le<&>", 1, 1, int64(1), "", 0)
	f.Fuzz(func(t *testing.T, line int, ok bool, command string, changed, unchanged int, ns int64, errText string, exit int) {
		r := sessionResult{Line: line, OK: ok, Command: command, Changed: changed, Unchanged: unchanged, ElapsedNS: ns, Error: errText, Exit: exit}
		want, err := json.Marshal(&r)
		if err != nil {
			t.Fatal(err)
		}
		got, err := r.appendJSON(nil)
		if err != nil || string(got) != string(want) {
			t.Fatalf("%+v:\n got %s (%v)\nwant %s", r, got, err, want)
		}
	})
}

// TestReadLines: stdin is split into lines as a script writes them (LF or
// CRLF, the last one without its newline); a line longer than maxLine is
// one "too long" line, not the end of the input, and the next is whole.
func TestReadLines(t *testing.T) {
	long := strings.Repeat("x", 2*maxLine+12345)
	exact := "enable " + strings.Repeat("y", maxLine-7)
	in := "enable a\r\n\ndisable b\n" + long + "\nstats\n" + exact + "\n" + long + "\r\n" + long + "\x00\nquit"
	got, err := readAll(strings.NewReader(in))
	if err != nil {
		t.Fatal(err)
	}
	want := []inputLine{{text: "enable a"}, {text: ""}, {text: "disable b"}, {tooLong: true}, {text: "stats"}, {text: exact},
		{tooLong: true}, {tooLong: true}, {text: "quit"}}
	if len(got) != len(want) {
		t.Fatalf("%d lines, want %d", len(got), len(want))
	}
	for i := range want {
		if got[i] != want[i] {
			t.Errorf("line %d: got %.40q (too long %v), want %.40q (too long %v)", i+1, got[i].text, got[i].tooLong, want[i].text, want[i].tooLong)
		}
	}
	// A last line that is too long and lacks its newline.
	got, err = readAll(strings.NewReader("stats\n" + long))
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 2 || got[0].text != "stats" || !got[1].tooLong {
		t.Fatalf("got %d lines: %+.20v", len(got), got)
	}
}

// readAll is every line readLines sends, in order, and its error.
func readAll(in io.Reader) ([]inputLine, error) {
	out := make(chan []inputLine)
	done := make(chan error, 1)
	go func() {
		done <- readLines(in, out)
		close(out)
	}()
	var got []inputLine
	for ls := range out {
		got = append(got, ls...)
	}
	return got, <-done
}

// TestReadLinesBatches: lines a single read brings arrive together (one
// send), sessionBatch at most, and a line is never held back waiting for
// more input: each write of a script is one batch, sent before the next
// write is read.
func TestReadLinesBatches(t *testing.T) {
	pr, pw := io.Pipe()
	out := make(chan []inputLine)
	done := make(chan error, 1)
	go func() {
		done <- readLines(pr, out)
		close(out)
	}()
	// One write of three lines and the start of a fourth: the three come
	// as one batch while the fourth is incomplete.
	go pw.Write([]byte("enable a\ndisable a\nstats\nena"))
	if b := <-out; len(b) != 3 || b[0].text != "enable a" || b[2].text != "stats" {
		t.Fatalf("first batch %+v, want the three complete lines", b)
	}
	go pw.Write([]byte("ble b\n"))
	if b := <-out; len(b) != 1 || b[0].text != "enable b" {
		t.Fatalf("second batch %+v, want enable b", b)
	}
	// More lines in one write than a batch holds: split at sessionBatch.
	go func() {
		pw.Write([]byte(strings.Repeat("stats\n", sessionBatch+5)))
		pw.Close()
	}()
	n := 0
	for b := range out {
		if len(b) > sessionBatch {
			t.Fatalf("a batch of %d lines, more than %d", len(b), sessionBatch)
		}
		n += len(b)
	}
	if err := <-done; err != nil || n != sessionBatch+5 {
		t.Fatalf("%d lines (%v), want %d", n, err, sessionBatch+5)
	}
}

// TestReadLinesEndless: an input that never ends its line (/dev/zero given
// as the commands) ends the reading with an error, after the lines before it.
func TestReadLinesEndless(t *testing.T) {
	f, err := os.Open("/dev/zero")
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	got, err := readAll(io.MultiReader(strings.NewReader("stats\n"), f))
	if !errors.Is(err, errNotCommands) {
		t.Fatalf("reading stats then /dev/zero: %v, want %v", err, errNotCommands)
	}
	if len(got) != 1 || got[0].text != "stats" {
		t.Fatalf("got %+v, want stats alone", got)
	}
}

// FuzzReadLines: readLines splits any input as a plain split on "\n" does
// (one "\r" before it dropped; a last line without "\n" kept unless
// empty), whatever the reads' sizes, and repeated lines keep their text.
func FuzzReadLines(f *testing.F) {
	f.Add("enable a\ndisable a\r\nenable a\n\nstats", uint8(3))
	f.Add("\r\n\r\r\nx\r", uint8(1))
	f.Add("", uint8(0))
	f.Fuzz(func(t *testing.T, in string, chunk uint8) {
		var want []string
		parts := strings.Split(in, "\n")
		for i, p := range parts {
			if i == len(parts)-1 && p == "" {
				break
			}
			want = append(want, strings.TrimSuffix(p, "\r"))
		}
		got, err := readAll(iotest.OneByteReader(strings.NewReader(in)))
		if chunk > 0 {
			got, err = readAll(&chunked{s: in, n: int(chunk)})
		}
		if err != nil {
			t.Fatal(err)
		}
		if len(got) != len(want) {
			t.Fatalf("%d lines, want %d: %q", len(got), len(want), want)
		}
		for i := range want {
			if got[i].tooLong || got[i].text != want[i] {
				t.Fatalf("line %d: %+v, want %q", i+1, got[i], want[i])
			}
		}
	})
}

// chunked reads s n bytes at a time.
type chunked struct {
	s string
	n int
}

func (c *chunked) Read(b []byte) (int, error) {
	if c.s == "" {
		return 0, io.EOF
	}
	k := copy(b[:min(len(b), c.n)], c.s)
	c.s = c.s[k:]
	return k, nil
}
