// Command testsummary runs `go test -json` with the arguments after "--",
// prints a readable log (internal/testjson.Tally), the slowest packages and
// tests, and last the line "N passed, N failed, N skipped". It exits 1 when
// go test failed, any test failed, a line of go test's output was not an
// event, or no test ran at all.
//
//	go run ./internal/testjson/cmd/testsummary [-json FILE] [-line FILE] -- -count=1 ./...
//
// `make test` runs it; .ci/run reprints -line's file after a failure so the
// CI log ends with the closing line.
package main

import (
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"time"

	"github.com/edgeprobe/edgeprobe/internal/testjson"
)

func main() {
	rawPath := flag.String("json", "", "also save go test's JSON events to `FILE`")
	linePath := flag.String("line", "", "also write the closing line to `FILE`")
	slowest := flag.Int("slowest", 8, "list the `N` slowest packages and tests")
	budget := flag.Duration("budget", 5*time.Minute, "flag a package that takes longer (docs/testing.md)")
	flag.Parse()

	var raw io.Writer
	if *rawPath != "" {
		f, err := create(*rawPath)
		if err != nil {
			fail(err)
		}
		defer f.Close()
		raw = f
	}
	cmd := exec.Command("go", append([]string{"test", "-json"}, flag.Args()...)...)
	cmd.Stderr = os.Stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		fail(err)
	}
	start := time.Now()
	if err := cmd.Start(); err != nil {
		fail(err)
	}
	tl := testjson.NewTally(os.Stdout)
	readErr := tl.Read(out, raw)
	waitErr := cmd.Wait()

	pkgs, tests := tl.Slowest(*slowest)
	fmt.Printf("\nslowest packages (of %s):\n", time.Since(start).Round(time.Second))
	for _, p := range pkgs {
		over := ""
		if p.Seconds > budget.Seconds() {
			over = fmt.Sprintf("  over the %v per-package budget", *budget)
		}
		fmt.Printf("  %7.1fs  %s%s\n", p.Seconds, p.Name, over)
	}
	fmt.Println("slowest tests:")
	for _, t := range tests {
		fmt.Printf("  %7.1fs  %s\n", t.Seconds, t.Name)
	}
	c := tl.Counts()
	ok := readErr == nil && waitErr == nil && c.Failed == 0 && tl.MalformedLines() == 0 && c.Passed+c.Skipped > 0
	switch {
	case readErr != nil:
		fmt.Printf("testsummary: reading go test's output: %v\n", readErr)
	case waitErr != nil && c.Failed == 0:
		fmt.Printf("testsummary: go test: %v\n", waitErr)
	case c.Passed+c.Failed+c.Skipped == 0:
		fmt.Println("testsummary: no test ran")
	}
	if !ok && c.Failed == 0 {
		c.Failed = 1 // the run itself broke: never close on "0 failed"
	}
	line := c.String()
	if *linePath != "" {
		if f, err := create(*linePath); err == nil {
			fmt.Fprintln(f, line)
			f.Close()
		}
	}
	fmt.Println(line)
	if !ok {
		os.Exit(1)
	}
}

func create(path string) (*os.File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return nil, err
	}
	return os.Create(path)
}

func fail(err error) {
	fmt.Fprintln(os.Stderr, "testsummary:", err)
	os.Exit(1)
}
