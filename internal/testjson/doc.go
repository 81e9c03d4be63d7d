// Package testjson reads `go test -json` and tells a person and a CI what
// happened: each package's result as it finishes, the full output of every
// failed test, one line per skipped test with its reason, the slowest
// packages and tests, and the closing line "N passed, N failed, N skipped"
// (see Tally for what counts). cmd/testsummary runs `go test -json` under it
// for `make test` and .ci/run.
package testjson
