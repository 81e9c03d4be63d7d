package procmaps

import (
	"os"
	"testing"
)

// TestCoveringText: on a kernel without PROCMAP_QUERY, Maps.Covering reads
// the text; both ways give the same mapping for every address this
// process maps (its first and last byte) and nothing below the lowest.
// (The kernel here has the ioctl; the text path is forced.)
func TestCoveringText(t *testing.T) {
	q, err := OpenMaps(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer q.Close()
	txt, err := OpenMaps(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	defer txt.Close()
	txt.text = true
	all, err := Read(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	for _, m := range all {
		if m.Path == "[vsyscall]" {
			continue
		}
		for _, addr := range []uint64{m.Start, m.End - 1} {
			a, aok, aerr := txt.Covering(addr)
			b, bok, berr := q.Covering(addr)
			if aerr != nil || !aok || aok != bok || berr != nil && q.Queries() {
				t.Fatalf("%#x: text %+v %v %v, query %+v %v %v", addr, a, aok, aerr, b, bok, berr)
			}
			if q.Queries() && a != b {
				// The process's own mappings may change between the two
				// calls (the Go runtime maps memory): only a difference
				// that persists is one.
				a, _, _ = txt.Covering(addr)
				b, _, _ = q.Covering(addr)
				if a != b {
					t.Errorf("%#x: text %+v, query %+v", addr, a, b)
				}
			}
		}
	}
	if all[0].Start > 0 {
		if m, ok, err := txt.Covering(all[0].Start - 1); ok || err != nil {
			t.Errorf("below every mapping: %+v %v %v", m, ok, err)
		}
	}
}

// TestExecFilesText: ExecFiles's answer on a kernel without PROCMAP_QUERY
// (the text, execFilesText) is the ioctl's, for this process.
func TestExecFilesText(t *testing.T) {
	q, err := ExecFiles(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	txt, err := execFilesText(os.Getpid())
	if err != nil {
		t.Fatal(err)
	}
	if len(q) == 0 || len(q) != len(txt) {
		t.Fatalf("ioctl %d mappings, text %d:\n%+v\n%+v", len(q), len(txt), q, txt)
	}
	for i := range q {
		if q[i] != txt[i] {
			t.Errorf("mapping %d: ioctl %+v, text %+v", i, q[i], txt[i])
		}
	}
}
