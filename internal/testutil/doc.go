// Package testutil builds the C fixtures the tests run against and holds the
// skip helpers for tests that need a compiler, root or ptrace rights.
//
// Every fixture is a real program compiled in the test from a .c file under
// testdata/fixtures, with the exact command recorded in Fixture.Command, so a
// failing test can be reproduced by hand. Builds are cached by a hash of the
// command and the source bytes, shared across test binaries of one `go test`
// run, so the gcc/clang x -O0..-O3 matrix stays affordable on two cores.
package testutil
