// Command hotpatch turns probes on and off in a running process without
// stopping it, and reads what the probes record. See internal/cli.
package main

import (
	"os"

	"github.com/edgeprobe/edgeprobe/internal/cli"
)

func main() { os.Exit(cli.HotpatchMain(os.Args[1:], os.Stdout, os.Stderr)) }
