package elfscan

import "errors"

// Sentinel errors; every error Scan returns wraps one of them in an *Error
// that says where in the file the problem is.
var (
	ErrNotELF      = errors.New("not an ELF file")
	ErrNotX86_64   = errors.New("not a 64-bit x86-64 ELF object")
	ErrTruncated   = errors.New("truncated ELF file")
	ErrMalformed   = errors.New("malformed ELF file")
	ErrUnsupported = errors.New("unsupported ELF object")
	ErrNoHookSites = errors.New("no call or jump to an instrumentation hook")
)

// Error is a scan failure: the sentinel Kind, and where it happened.
type Error struct {
	Path   string
	Where  string // "offset 0x…", "address 0x…", or "" for the object as a whole
	Kind   error  // one of the Err* sentinels
	Detail string
}

func (e *Error) Error() string {
	s := e.Path + ": "
	if e.Where != "" {
		s += e.Where + ": "
	}
	s += e.Kind.Error()
	if e.Detail != "" {
		s += ": " + e.Detail
	}
	return s
}

func (e *Error) Unwrap() error { return e.Kind }
