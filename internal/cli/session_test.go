package cli

import (
	"encoding/json"
	"errors"
	"io"
	"os"
	"reflect"
	"strings"
	"testing"
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
	out := make(chan inputLine, 100)
	if err := readLines(strings.NewReader(in), out); err != nil {
		t.Fatal(err)
	}
	close(out)
	var got []inputLine
	for l := range out {
		got = append(got, l)
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
	out = make(chan inputLine, 2)
	if err := readLines(strings.NewReader("stats\n"+long), out); err != nil {
		t.Fatal(err)
	}
	if a, b := <-out, <-out; a.text != "stats" || !b.tooLong {
		t.Fatalf("got %.20q then %.20q (too long %v)", a.text, b.text, b.tooLong)
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
	out := make(chan inputLine, 10)
	if err := readLines(io.MultiReader(strings.NewReader("stats\n"), f), out); !errors.Is(err, errNotCommands) {
		t.Fatalf("reading stats then /dev/zero: %v, want %v", err, errNotCommands)
	}
	if l := <-out; l.text != "stats" || len(out) != 0 {
		t.Fatalf("got %q and %d more lines, want stats alone", l.text, len(out))
	}
}
