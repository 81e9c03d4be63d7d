package testutil

import (
	"fmt"
	"os"
	"path/filepath"
)

// Tests never read or fill the user's own probe cache: every test binary
// that imports testutil, and every command it runs, uses a cache of its
// own user under the temporary directory (internal/probecache.EnvDir),
// unless EDGEPROBE_CACHE is set already. It is shared by the test binaries
// of a run, as the user's would be by hotpatch calls.
func init() {
	if os.Getenv("EDGEPROBE_CACHE") == "" {
		os.Setenv("EDGEPROBE_CACHE", filepath.Join(os.TempDir(), fmt.Sprintf("edgeprobe-test-cache-%d", os.Geteuid())))
	}
}
