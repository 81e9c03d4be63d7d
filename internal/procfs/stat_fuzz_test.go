package procfs

import (
	"fmt"
	"testing"
)

// FuzzParseStat: a stat line whose command name the process chose (any
// bytes but NUL and newline, at most 64, with spaces, parentheses and a
// fake ") Z ..." tail included) parses to the state and times the kernel
// wrote after it; arbitrary bytes never panic.
func FuzzParseStat(f *testing.F) {
	f.Add([]byte("bash"), byte('S'), uint64(12), uint64(34), uint64(5678))
	f.Add([]byte("a) Z 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20"), byte('R'), uint64(0), uint64(1), uint64(2))
	f.Add([]byte("((( ))) )"), byte('Z'), uint64(1<<63), uint64(0), uint64(9))
	f.Fuzz(func(t *testing.T, comm []byte, state byte, utime, stime, start uint64) {
		parseStat(comm)                                                                        // arbitrary text: no panic
		if len(comm) > 64 || !(state >= 'A' && state <= 'Z' || state >= 'a' && state <= 'z') { // the kernel's states are letters
			return
		}
		for _, c := range comm {
			if c == 0 || c == '\n' {
				return
			}
		}
		line := fmt.Sprintf("4242 (%s) %c 1 4242 4242 0 -1 4194560 100 0 0 0 %d %d 0 0 20 0 1 0 %d 1000 100 18446744073709551615\n",
			comm, state, utime, stime, start)
		st, ok := parseStat([]byte(line))
		if !ok || st.State != state || st.Utime != utime || st.Stime != stime || st.StartTime != start {
			t.Fatalf("comm %q: parsed %+v, %v; want state %c utime %d stime %d start %d", comm, st, ok, state, utime, stime, start)
		}
	})
}
