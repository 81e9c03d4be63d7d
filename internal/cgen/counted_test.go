package cgen

import (
	"strings"
	"testing"
)

func TestCounted(t *testing.T) {
	src := string(Counted(3))
	for _, want := range []string{"int f0(int x) { return x * 3 + 1; }", "int f2(int x) { return x * 3 + 3; }",
		"f0,f1,f2,", "#define N 3", "c <= i % 3", "ready %d"} {
		if !strings.Contains(src, want) {
			t.Errorf("Counted(3) lacks %q:\n%s", want, src)
		}
	}
	if strings.Contains(src, "f3") {
		t.Error("Counted(3) defines f3")
	}
	for i, want := range []uint64{1, 2, 3, 1} {
		if got := CountedCalls(i); got != want {
			t.Errorf("CountedCalls(%d) = %d, want %d (the program's c <= i %% 3 loop)", i, got, want)
		}
	}
}
