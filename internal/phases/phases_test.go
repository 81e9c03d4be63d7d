package phases

import (
	"bytes"
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
