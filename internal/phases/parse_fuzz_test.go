package phases

import (
	"fmt"
	"math"
	"testing"
)

// FuzzParse: Print's lines with any values read back as written (µs as
// ns, exactly); a value in µs whose ns do not fit an int64 is an error,
// never a wrapped number; arbitrary text never panics.
func FuzzParse(f *testing.F) {
	f.Add([]byte("phase start mono=5 cpu=1us\nphase total wall=2us cpu=3us mono=9\n"), int64(5), int64(7), "load")
	f.Add([]byte("phase x wall=99999999999999999us\n"), int64(math.MaxInt64/1000+1), int64(0), "x")
	f.Fuzz(func(t *testing.T, text []byte, wallUs, mono int64, name string) {
		Parse(text)
		if mono <= 0 || wallUs < 0 || name == "" || len(fmt.Sprint(name)) != len(name) {
			return
		}
		for _, c := range name {
			if c <= ' ' || c > '~' || c == '=' {
				return
			}
		}
		table := fmt.Sprintf("phase start mono=%d cpu=0us vcsw=0 ivcsw=0 minflt=0\nphase %s wall=%dus cpu=0us vcsw=1 ivcsw=0 minflt=2\nphase total wall=%dus cpu=0us vcsw=1 ivcsw=0 minflt=2 mono=%d\n",
			mono, name, wallUs, wallUs, mono)
		lines, err := Parse([]byte(table))
		if wallUs > math.MaxInt64/1000 {
			if err == nil {
				t.Fatalf("wall=%dus: parsed %+v; want an error (its ns do not fit)", wallUs, lines)
			}
			return
		}
		if err != nil || len(lines) != 3 || lines[1].Name != name || lines[1].Wall != wallUs*1000 || lines[2].Mono != mono {
			t.Fatalf("%q: %+v, %v", table, lines, err)
		}
	})
}
