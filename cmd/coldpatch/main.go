// Command coldpatch makes the -finstrument-functions hook sites of an ELF
// binary inert and prints their probe list. See internal/cli.
package main

import (
	"os"

	"github.com/edgeprobe/edgeprobe/internal/cli"
)

func main() { os.Exit(cli.ColdpatchMain(os.Args[1:], os.Stdout, os.Stderr)) }
