package probelist

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
)

// sample returns a valid list with an entry and an exit probe of one
// function and an inlined copy elsewhere.
func sample(t testing.TB) *List {
	t.Helper()
	mk := func(id int, kind, fn, container string, addr uint64, enc string, active []byte) Probe {
		inert, err := InertForm(enc, active, PlaceholderFlip)
		if err != nil {
			t.Fatal(err)
		}
		n := len(active)
		return Probe{ID: id, Kind: kind, Provider: ProviderCyg, Function: fn, FunctionAddress: 0x1100, Resolved: true,
			Container: container, Hook: "__cyg_profile_func_enter", Address: Hex(addr), Offset: Hex(addr - 0x1000),
			Encoding: enc, Placeholder: PlaceholderFlip, Active: active, Inert: inert,
			Straddle: Straddle(addr, n), Source: "basic.c:10"}
	}
	return &List{Format: Format, Version: Version, Placeholder: PlaceholderFlip,
		Binary: Binary{Path: "/bin/app", BuildID: "abcd", Size: 0x4000, Type: "dyn"},
		Probes: []Probe{
			mk(0, KindEntry, "sq", "sq", 0x1110, EncCallRel32, []byte{0xe8, 1, 2, 3, 4}),
			mk(1, KindExit, "sq", "sq", 0x113e, EncJmpRel32, []byte{0xe9, 1, 2, 3, 4}),
			mk(2, KindEntry, "sq", "sum_squares", 0x1200, EncCallGOT, []byte{0xff, 0x15, 1, 2, 3, 4}),
			mk(3, KindExit, "sum_squares", "sum_squares", 0x1220, EncAddr32Call, []byte{0x67, 0xe8, 1, 2, 3, 4}),
		}}
}

func TestRoundTrip(t *testing.T) {
	l := sample(t)
	var buf bytes.Buffer
	if err := l.Write(&buf); err != nil {
		t.Fatal(err)
	}
	got, err := Read(bytes.NewReader(buf.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	var again bytes.Buffer
	if err := got.Write(&again); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Fatalf("round trip changed the document:\n%s\n---\n%s", buf.Bytes(), again.Bytes())
	}
	if got.Probes[1].Straddle != "2|3" {
		t.Errorf("probe at 0x113e: straddle %q, want 2|3", got.Probes[1].Straddle)
	}
	for _, want := range []string{`"address": "0x1110"`, `"active": "e801020304"`, `"inert": "3d01020304"`, `"inert": "c301020304"`, `"inert": "3b1501020304"`, `"inert": "673d01020304"`} {
		if !strings.Contains(buf.String(), want) {
			t.Errorf("document lacks %s", want)
		}
	}
}

func TestReadRejects(t *testing.T) {
	var good bytes.Buffer
	if err := sample(t).Write(&good); err != nil {
		t.Fatal(err)
	}
	cases := []struct{ name, from, to, wantErr string }{
		{"format", `"edgeprobe-probes"`, `"other"`, "format"},
		{"version", `"version": 1`, `"version": 2`, "version 2 is not supported"},
		{"unknown field", `"kind": "entry"`, `"kind": "entry", "extra": 1`, "unknown field"},
		{"kind", `"kind": "entry"`, `"kind": "middle"`, "kind \"middle\""},
		{"provider missing", `"provider": "cyg",`, ``, "provider \"\" is neither"},
		{"provider unknown", `"provider": "cyg"`, `"provider": "xray"`, "provider \"xray\""},
		{"hook of another provider", `"provider": "cyg"`, `"provider": "fentry"`, "is not a fentry hook"},
		{"address not hex", `"address": "0x1110"`, `"address": "4368"`, "hex string"},
		{"bytes not hex", `"active": "e801020304"`, `"active": "zz"`, "hex byte string"},
		{"flip differs twice", `"inert": "3d01020304"`, `"inert": "3d01020305"`, "differs from the active form in 2 bytes"},
		{"length", `"active": "e801020304"`, `"active": "e8010203"`, "want 5"},
		{"encoding", `"encoding": "call_rel32"`, `"encoding": "call_reg"`, "unknown encoding"},
		{"straddle", `"straddle": "2|3"`, `"straddle": ""`, "straddle"},
		{"id order", `"id": 1`, `"id": 7`, "id is 7, want 1"},
		{"offset past end", `"size": 16384`, `"size": 16`, "past the end"},
		{"trailing", "", "{}", "trailing data"},
		{"syntax", `"probes": [`, `"probes": [[`, "JSON syntax error at byte"},
		{"type", `"version": 1`, `"version": "1"`, "cannot unmarshal"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			doc := strings.Replace(good.String(), c.from, c.to, 1)
			if c.from == "" {
				doc = good.String() + c.to
			}
			if doc == good.String() || (c.from != "" && !strings.Contains(good.String(), c.from)) {
				t.Fatalf("test bug: %q not found in the document", c.from)
			}
			_, err := Read(strings.NewReader(doc))
			if err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.wantErr) {
				t.Fatalf("Read: %v, want ErrFormat mentioning %q", err, c.wantErr)
			}
		})
	}
}

// fentrySample is a list with both providers: a function built with
// -finstrument-functions -pg -mfentry has an fentry entry site, then cyg
// entry and exit sites.
func fentrySample(t testing.TB) *List {
	t.Helper()
	l := sample(t)
	fentry := func(fn string, addr uint64, enc string, active []byte) Probe {
		inert, err := InertForm(enc, active, PlaceholderFlip)
		if err != nil {
			t.Fatal(err)
		}
		return Probe{Kind: KindEntry, Provider: ProviderFentry, Function: fn, FunctionAddress: Hex(addr), Resolved: true,
			Container: fn, Hook: HookFentry, Address: Hex(addr), Offset: Hex(addr - 0x1000), Encoding: enc,
			Placeholder: PlaceholderFlip, Active: active, Inert: inert, Straddle: Straddle(addr, len(active))}
	}
	l.Probes = append([]Probe{
		fentry("sq", 0x1100, EncCallRel32, []byte{0xe8, 1, 2, 3, 4}),
		fentry("only_fentry", 0x1105, EncCallGOT, []byte{0xff, 0x15, 1, 2, 3, 4}),
	}, l.Probes...)
	for i := range l.Probes {
		l.Probes[i].ID = i
	}
	if err := l.Validate(); err != nil {
		t.Fatal(err)
	}
	return l
}

func TestFentryValidation(t *testing.T) {
	var good bytes.Buffer
	if err := fentrySample(t).Write(&good); err != nil {
		t.Fatal(err)
	}
	if _, err := Read(bytes.NewReader(good.Bytes())); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct{ name, from, to, wantErr string }{
		{"exit", `"kind": "entry",
      "provider": "fentry"`, `"kind": "exit",
      "provider": "fentry"`, "no fentry exit site"},
		{"cyg hook", `"hook": "__fentry__"`, `"hook": "__cyg_profile_func_enter"`, "is not a fentry hook"},
		{"mcount", `"hook": "__fentry__"`, `"hook": "mcount"`, "is not a fentry hook"},
	} {
		doc := strings.Replace(good.String(), c.from, c.to, 1)
		if doc == good.String() {
			t.Fatalf("%s: test bug: %q not found", c.name, c.from)
		}
		if _, err := Read(strings.NewReader(doc)); err == nil || !errors.Is(err, ErrFormat) || !strings.Contains(err.Error(), c.wantErr) {
			t.Errorf("%s: Read = %v, want ErrFormat mentioning %q", c.name, err, c.wantErr)
		}
	}
	// A tail jump to __fentry__ is no fentry site.
	l := fentrySample(t)
	l.Probes[0].Encoding, l.Probes[0].Active, l.Probes[0].Inert = EncJmpRel32, Bytes{0xe9, 1, 2, 3, 4}, Bytes{0xc3, 1, 2, 3, 4}
	if err := l.Validate(); err == nil || !strings.Contains(err.Error(), "an fentry site is a call") {
		t.Errorf("fentry jmp site: %v", err)
	}
}

func TestSelectProvider(t *testing.T) {
	l := fentrySample(t) // 0 fentry sq, 1 fentry only_fentry, 2.. the cyg sample
	for _, c := range []struct {
		pattern, kind, provider string
		want                    []int
		err                     error
	}{
		{"sq", "", "", []int{0, 2, 3, 4}, nil},
		{"sq", KindBoth, ProviderAll, []int{0, 2, 3, 4}, nil},
		{"sq", KindEntry, ProviderFentry, []int{0}, nil},
		{"sq", "", ProviderCyg, []int{2, 3, 4}, nil},
		{"sq", KindExit, ProviderCyg, []int{3}, nil},
		{"only_fentry", KindBoth, "", []int{1}, nil},
		{"only_fentry", "", ProviderCyg, nil, ErrNoMatch},
		// exits of an fentry probe come from the runtime, not the binary
		{"only_fentry", KindExit, "", nil, ErrNoExitSite},
		{"sq", KindExit, "", nil, ErrNoExitSite},
		{"sq", KindExit, ProviderFentry, nil, ErrNoExitSite},
		{"*", KindExit, "", nil, ErrNoExitSite},
		{"id:1", KindExit, "", nil, ErrNoExitSite},
		{"id:1", KindEntry, "", []int{1}, nil},
		{"id:1", "", ProviderCyg, nil, ErrNoMatch},
	} {
		prov, err := ParseProvider(c.provider)
		if err != nil {
			t.Fatal(err)
		}
		s, err := ParseSelector(c.pattern, c.kind)
		if err != nil {
			t.Fatal(err)
		}
		s.Provider = prov
		got, err := l.Select(s)
		if c.err != nil {
			if !errors.Is(err, c.err) {
				t.Errorf("Select(%q, %q, %q) = %v, %v; want %v", c.pattern, c.kind, c.provider, got, err, c.err)
			}
			if errors.Is(err, ErrNoExitSite) && !strings.Contains(err.Error(), "EDGEPROBE_FENTRY_EXITS=1") {
				t.Errorf("ErrNoExitSite message does not say where exits come from: %v", err)
			}
			continue
		}
		if err != nil || fmt.Sprint(got) != fmt.Sprint(c.want) {
			t.Errorf("Select(%q, %q, %q) = %v, %v; want %v", c.pattern, c.kind, c.provider, got, err, c.want)
		}
	}
	if _, err := ParseProvider("xray"); err == nil {
		t.Error("ParseProvider accepted xray")
	}
}

func TestInertForms(t *testing.T) {
	cases := []struct {
		enc, style   string
		active, want []byte
	}{
		{EncCallRel32, PlaceholderFlip, []byte{0xe8, 1, 2, 3, 4}, []byte{0x3d, 1, 2, 3, 4}},
		{EncCallRel32, PlaceholderNop, []byte{0xe8, 1, 2, 3, 4}, []byte{0x0f, 0x1f, 0x44, 0, 0}},
		{EncJmpRel32, PlaceholderNop, []byte{0xe9, 1, 2, 3, 4}, []byte{0xc3, 1, 2, 3, 4}},
		{EncCallGOT, PlaceholderNop, []byte{0xff, 0x15, 1, 2, 3, 4}, []byte{0x66, 0x0f, 0x1f, 0x44, 0, 0}},
		{EncJmpGOT, PlaceholderFlip, []byte{0xff, 0x25, 1, 2, 3, 4}, []byte{0xc3, 0x25, 1, 2, 3, 4}},
		{EncAddr32Call, PlaceholderNop, []byte{0x67, 0xe8, 1, 2, 3, 4}, []byte{0x66, 0x0f, 0x1f, 0x44, 0, 0}},
	}
	for _, c := range cases {
		got, err := InertForm(c.enc, c.active, c.style)
		if err != nil || !bytes.Equal(got, c.want) {
			t.Errorf("InertForm(%s, % x, %s) = % x, %v; want % x", c.enc, c.active, c.style, got, err, c.want)
		}
		if c.style == PlaceholderFlip {
			back, ok := ActiveFromFlip(c.enc, got)
			if !ok || !bytes.Equal(back, c.active) {
				t.Errorf("ActiveFromFlip(%s, % x) = % x, %v", c.enc, got, back, ok)
			}
		}
	}
	if _, err := InertForm(EncCallRel32, []byte{0xe9, 1, 2, 3, 4}, PlaceholderFlip); err == nil {
		t.Error("InertForm accepted a jmp as a call")
	}
	if _, err := InertForm(EncJmpRel32, []byte{0xe9, 1, 2, 3, 4}, "bogus"); err == nil {
		t.Error("InertForm accepted an unknown placeholder")
	}
}

func TestStraddle(t *testing.T) {
	for _, c := range []struct {
		addr uint64
		n    int
		want string
	}{{0, 5, ""}, {59, 5, ""}, {60, 5, "4|1"}, {61, 5, "3|2"}, {62, 5, "2|3"}, {63, 5, "1|4"}, {63, 6, "1|5"}, {64, 6, ""}, {58, 6, ""}, {59, 6, "5|1"}} {
		if got := Straddle(c.addr, c.n); got != c.want {
			t.Errorf("Straddle(%d, %d) = %q, want %q", c.addr, c.n, got, c.want)
		}
	}
}

func TestSelect(t *testing.T) {
	l := sample(t)
	for _, c := range []struct {
		pattern, kind string
		want          []int
	}{
		{"sq", "", []int{0, 1, 2}}, // every copy, the inlined one included
		{"sq", KindEntry, []int{0, 2}},
		{"s*", KindExit, []int{1, 3}},
		{"*", KindBoth, []int{0, 1, 2, 3}},
		{"id:3", "", []int{3}},
	} {
		s, err := ParseSelector(c.pattern, c.kind)
		if err != nil {
			t.Fatal(err)
		}
		got, err := l.Select(s)
		if err != nil || len(got) != len(c.want) {
			t.Fatalf("Select(%q, %q) = %v, %v; want %v", c.pattern, c.kind, got, err, c.want)
		}
		for i := range got {
			if got[i] != c.want[i] {
				t.Fatalf("Select(%q, %q) = %v; want %v", c.pattern, c.kind, got, c.want)
			}
		}
	}
	s, _ := ParseSelector("nothing", "")
	if _, err := l.Select(s); !errors.Is(err, ErrNoMatch) {
		t.Errorf("Select(nothing) = %v, want ErrNoMatch", err)
	}
	for _, bad := range [][2]string{{"id:x", ""}, {"[", ""}, {"f", "middle"}, {"", ""}} {
		if _, err := ParseSelector(bad[0], bad[1]); err == nil {
			t.Errorf("ParseSelector(%q, %q) accepted", bad[0], bad[1])
		}
	}
}

func TestWriteFileAtomic(t *testing.T) {
	dir := t.TempDir()
	p := filepath.Join(dir, "probes.json")
	if err := sample(t).WriteFile(p); err != nil {
		t.Fatal(err)
	}
	if _, err := ReadFile(p); err != nil {
		t.Fatal(err)
	}
	entries, _ := os.ReadDir(dir)
	if len(entries) != 1 {
		t.Fatalf("temporary files left behind: %v", entries)
	}
	if _, err := ReadFile(filepath.Join(dir, "missing.json")); !errors.Is(err, os.ErrNotExist) {
		t.Fatalf("ReadFile(missing) = %v", err)
	}
}

// FuzzRead checks that no document makes Read panic, and that whatever Read
// accepts survives a write/read round trip unchanged.
func FuzzRead(f *testing.F) {
	var good bytes.Buffer
	if err := sample(f).Write(&good); err != nil {
		f.Fatal(err)
	}
	f.Add(good.Bytes())
	var both bytes.Buffer
	if err := fentrySample(f).Write(&both); err != nil {
		f.Fatal(err)
	}
	f.Add(both.Bytes())
	f.Add([]byte(`{"format":"edgeprobe-probes","version":1}`))
	f.Fuzz(func(t *testing.T, doc []byte) {
		l, err := Read(bytes.NewReader(doc))
		if err != nil {
			return
		}
		var out bytes.Buffer
		if err := l.Write(&out); err != nil {
			t.Fatal(err)
		}
		if _, err := Read(&out); err != nil {
			t.Fatalf("re-reading an accepted list failed: %v", err)
		}
	})
}

// TestOpenFileRefuses: OpenFile takes a regular file of at most
// MaxFileBytes only, and reads no further than its size at the open; it
// neither waits on a FIFO without a writer nor reads a device.
func TestOpenFileRefuses(t *testing.T) {
	dir := t.TempDir()
	fifo := filepath.Join(dir, "fifo")
	if err := syscall.Mkfifo(fifo, 0o600); err != nil {
		t.Fatal(err)
	}
	big := filepath.Join(dir, "big")
	if err := os.WriteFile(big, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(big, MaxFileBytes+1); err != nil {
		t.Fatal(err)
	}
	for _, path := range []string{"/dev/zero", "/dev/null", fifo, dir, big} {
		f, _, err := OpenFile(path)
		if err == nil {
			f.Close()
			t.Errorf("%s: opened", path)
		} else if !errors.Is(err, ErrFormat) {
			t.Errorf("%s: %v, want ErrFormat", path, err)
		}
	}
	// A file that grows after the open is read to its size at the open.
	good := filepath.Join(dir, "good")
	if err := os.WriteFile(good, []byte("0123456789"), 0o600); err != nil {
		t.Fatal(err)
	}
	f, r, err := OpenFile(good)
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	w, err := os.OpenFile(good, os.O_WRONLY|os.O_APPEND, 0)
	if err != nil {
		t.Fatal(err)
	}
	w.WriteString("more")
	w.Close()
	if b, err := io.ReadAll(r); err != nil || string(b) != "0123456789" {
		t.Errorf("read %q, %v; want the 10 bytes there at the open", b, err)
	}
}
