package cli

import (
	"strings"

	"github.com/spf13/pflag"
)

// stringsValue is a repeatable string flag that behaves as pflag's
// StringArray (each use appends one value, commas included) but is cheaper
// to define: pflag takes every flag's default as a string when it is
// defined, and a StringArray's String builds a CSV writer for it. Every
// invocation defines the flags of every subcommand, --probes among them in
// most (D71).
type stringsValue struct{ p *[]string }

func (v stringsValue) Set(s string) error { *v.p = append(*v.p, s); return nil }

// Type is pflag's, so help and completion treat the flag as one.
func (v stringsValue) Type() string { return "stringArray" }

// String is "" with no value, which help takes as no default to show (as
// it takes StringArray's "[]"); else the values, pflag's way.
func (v stringsValue) String() string {
	if v.p == nil || len(*v.p) == 0 {
		return ""
	}
	return "[" + strings.Join(*v.p, ",") + "]"
}

// stringsVarP defines a repeatable string flag (stringsValue) on fs.
func stringsVarP(fs *pflag.FlagSet, p *[]string, name, short, usage string) {
	*p = nil
	fs.VarP(stringsValue{p}, name, short, usage)
}
