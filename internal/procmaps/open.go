package procmaps

import "os"

// Open opens the file behind o exactly as the process mapped it (through
// map_files when possible), for scanning an object that may have been
// replaced or deleted on disk since the process started.
func Open(pid int, o *Object) (*os.File, error) { return openMapped(pid, o.Mappings[0]) }
