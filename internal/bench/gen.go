package bench

import (
	"bytes"
	"fmt"
)

// GenMany returns the C source of n instrumented functions f0..f{n-1} and the
// table bench/many_main.c calls them through. Each body differs (its own
// constant), so no compiler folds two functions into one.
func GenMany(n int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "/* many_funcs.c: %d functions for the batch benchmark, written by\n"+
		" * internal/bench.GenMany; build with bench/many_main.c (see there). */\n", n)
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "__attribute__((noinline)) int f%d(int x) { return x * 3 + %d; }\n", i, i+1)
	}
	b.WriteString("int (*const many_table[])(int) = {\n")
	for i := 0; i < n; i++ {
		fmt.Fprintf(&b, "f%d,", i)
		if i%16 == 15 {
			b.WriteByte('\n')
		}
	}
	fmt.Fprintf(&b, "};\nconst int many_count = %d;\n", n)
	return b.Bytes()
}
