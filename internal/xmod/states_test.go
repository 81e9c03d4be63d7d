package xmod

import "testing"

func TestSameStates(t *testing.T) {
	a := []State{StateActive, StateInert, StateInvalid, StateTorn}
	for _, c := range []struct {
		a, b []State
		want bool
	}{
		{nil, nil, true},
		{nil, []State{}, true},
		{a, append([]State(nil), a...), true},
		{a, a[:3], false},
		{a, []State{StateActive, StateInert, StateInvalid, StateActive}, false},
		{[]State{StateInert}, []State{StateActive}, false},
	} {
		if got := SameStates(c.a, c.b); got != c.want {
			t.Errorf("SameStates(%v, %v) = %v, want %v", c.a, c.b, got, c.want)
		}
	}
}
