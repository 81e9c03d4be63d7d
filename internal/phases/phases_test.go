package phases

import (
	"bytes"
	"errors"
	"fmt"
	"strings"
	"testing"
)

func TestPrint(t *testing.T) {
	was := on
	defer func() { on, marks = was, nil }()

	on, marks = false, nil
	Mark("start")
	var b bytes.Buffer
	Print(&b)
	if len(marks) != 0 || b.Len() != 0 {
		t.Fatalf("off: %d marks, printed %q", len(marks), b.String())
	}

	on = true
	Mark("start")
	x := make([]byte, 1<<20) // a phase that faults pages in
	for i := range x {
		x[i] = byte(i)
	}
	Mark("work")
	Print(&b)
	lines := strings.Split(strings.TrimSpace(b.String()), "\n")
	if len(lines) != 3 {
		t.Fatalf("want start, work and total lines, got %q", b.String())
	}
	for i, want := range []string{"phase start ", "phase work ", "phase total "} {
		if !strings.HasPrefix(lines[i], want) {
			t.Errorf("line %d: %q, want prefix %q", i, lines[i], want)
		}
	}
	if !strings.Contains(lines[0], "mono=") || !strings.Contains(lines[2], "mono=") {
		t.Errorf("start and total lines carry the clock: %q", b.String())
	}
	var wall, flt int64
	if _, err := sscanField(lines[1], "wall=%dus", &wall); err != nil {
		t.Fatal(err)
	}
	if _, err := sscanField(lines[1], "minflt=%d", &flt); err != nil {
		t.Fatal(err)
	}
	if flt < 1 {
		t.Errorf("touching 1 MiB of fresh memory counted %d page faults", flt)
	}
	if wall < 0 {
		t.Errorf("wall %d", wall)
	}

	marks = nil
	for i := 0; i < maxMarks+10; i++ {
		Mark("x")
	}
	if len(marks) != maxMarks {
		t.Errorf("%d marks kept, want the first %d", len(marks), maxMarks)
	}
}

// sscanField scans the field of line that starts like format.
func sscanField(line, format string, v *int64) (int, error) {
	key := format[:strings.IndexByte(format, '=')+1]
	for _, f := range strings.Fields(line) {
		if strings.HasPrefix(f, key) {
			return fmt.Sscanf(f, format, v)
		}
	}
	return 0, fmt.Errorf("no field %s in %q", key, line)
}

// TestParse: what Print writes reads back with the same names and figures
// (Print's µs, as ns), with other lines around it skipped; text without a
// whole table is refused.
func TestParse(t *testing.T) {
	was := on
	defer func() { on, marks = was, nil }()
	on, marks = true, nil
	Mark("start")
	x := make([]byte, 1<<20) // a phase long enough to show in µs, with faults
	for i := range x {
		x[i] = byte(i)
	}
	Mark("lock")
	Mark("write")
	var b bytes.Buffer
	b.WriteString("hotpatch: 2 changed\n")
	Print(&b)
	b.WriteString("phase\n")
	lines, err := Parse(b.Bytes())
	if err != nil {
		t.Fatalf("%v: %q", err, b.String())
	}
	var names []string
	for _, l := range lines {
		names = append(names, l.Name)
	}
	if got := strings.Join(names, " "); got != "start lock write total" {
		t.Fatalf("phases %q, want start lock write total", got)
	}
	if lines[0].Mono != marks[0].mono || lines[3].Mono != marks[2].mono {
		t.Errorf("clock: %d and %d, want %d and %d", lines[0].Mono, lines[3].Mono, marks[0].mono, marks[2].mono)
	}
	if want := (marks[2].cpu - marks[1].cpu) / 1000 * 1000; lines[2].CPU != want {
		t.Errorf("write's CPU %d ns, want %d", lines[2].CPU, want)
	}
	if want := (marks[1].mono - marks[0].mono) / 1000 * 1000; lines[1].Wall != want || want == 0 {
		t.Errorf("lock's wall %d ns, want %d (not 0)", lines[1].Wall, want)
	}
	if want := marks[1].minflt - marks[0].minflt; lines[1].Minflt != want || want == 0 {
		t.Errorf("lock's faults %d, want %d (not 0)", lines[1].Minflt, want)
	}
	for _, bad := range []string{"", "phase start mono=1 cpu=1us\n", "phase start mono=1\nphase total wall=1us\n", "phase start mono=x\nphase total mono=2\n"} {
		if _, err := Parse([]byte(bad)); err == nil {
			t.Errorf("Parse(%q) = nil error", bad)
		}
	}
	if _, err := Parse([]byte("phase start mono=1\nphase total mono=2\n")); err != nil {
		t.Errorf("a table of the first mark and the total: %v", err)
	}
	if _, err := Parse([]byte("phase start mono=1 cpu=1us\n")); !errors.Is(err, ErrNoTable) {
		t.Errorf("no total line: %v, want ErrNoTable", err)
	}
}
