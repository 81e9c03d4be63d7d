package shm

import (
	"bufio"
	"os/exec"
	"path/filepath"
	"reflect"
	"strconv"
	"strings"
	"testing"
	"unsafe"

	"github.com/edgeprobe/edgeprobe/internal/testutil"
)

// TestLayoutMatchesC compiles testdata/layout.c against runtime/edgeprobe_shm.h
// and checks every struct size, field offset, field size and constant it
// prints against the Go mirror.
func TestLayoutMatchesC(t *testing.T) {
	testutil.RequireTool(t, "gcc")
	bin := filepath.Join(t.TempDir(), "layout")
	inc := filepath.Join(testutil.RepoRoot(t), "runtime")
	if out, err := exec.Command("gcc", "-Wall", "-Wextra", "-Werror", "-I", inc, "testdata/layout.c", "-o", bin).CombinedOutput(); err != nil {
		t.Fatalf("building layout.c: %v\n%s", err, out)
	}
	out, err := exec.Command(bin).Output()
	if err != nil {
		t.Fatal(err)
	}
	goTypes := map[string]reflect.Type{
		"ep_header": reflect.TypeOf(Header{}), "ep_func": reflect.TypeOf(funcEntry{}),
		"ep_thread": reflect.TypeOf(threadSlot{}), "ep_local": reflect.TypeOf(localEntry{}),
		"ep_frame": reflect.TypeOf(frame{}), "ep_event": reflect.TypeOf(event{}), "ep_argplan": reflect.TypeOf(argPlan{}),
		"ep_inflight_site": reflect.TypeOf(InflightSite{}), "ep_inflight": reflect.TypeOf(inflightHead{}),
	}
	const layoutSpec = 0x0f2a15a5c3e7
	consts := map[string]uint64{
		"EP_MAGIC": Magic, "EP_VERSION": uint64(Version), "EP_HEADER_SIZE": HeaderSize, "EP_HIST_BUCKETS": HistBuckets,
		"EP_KEY_BARE": KeyBare, "EP_CLOCK_TSC": ClockTSC, "EP_CLOCK_MONO": ClockMono,
		"EP_STATE_RUNNING": StateRunning, "EP_STATE_EXITED": StateExited,
		"EP_CTL_TRACE": uint64(CtlTrace), "EP_CTL_NOTIME": uint64(CtlNoTime), "EP_CTL_PAUSE": uint64(CtlPause), "EP_CTL_QUOTA": uint64(CtlQuota), "EP_CTL_FILTER": uint64(CtlFilter), "EP_FILTER_TIDS": FilterTids,
		"EP_SLOT_OWNED": slotOwned, "EP_EV_ENTER": EvEnter, "EP_EV_EXIT": EvExit, "EP_EV_THREAD": EvThread,
		"EP_FENTRY_USED": uint64(FentryUsed), "EP_FENTRY_EXITS": uint64(FentryExits),
		"EP_FENTRY_EXITS_OFF": uint64(FentryExitsOff), "EP_FENTRY_SHSTK": uint64(FentrySHSTK),
		"EP_EV_KIND_SHIFT": evKindShift, "EP_EV_TS_MASK": evTSMask,
		"EP_EV_DATA": EvData, "EP_CTL_ARGS": uint64(CtlArgs), "EP_DATA_ARGS": DataArgs, "EP_DATA_RET": DataRet, "EP_DATA_GEN": DataGen,
		"EP_DATA_SUB_SHIFT": dataSubShift, "EP_DATA_SLOTS_SHIFT": dataSlotsShift, "EP_DATA_SPEC_MASK": dataSpecMask,
		"EP_STR_MAX": StrMax, "EP_STACK_MAX": StackMax, "EP_STR_COMPLETE": StrComplete, "EP_STR_FAULT": StrFault,
		"EP_ARGPLANS": ArgPlans, "EP_PLAN_ENTRY": PlanEntry, "EP_PLAN_EXIT": PlanExit, "EP_PLAN_RSTR": PlanRStr,
		"SPEC_INT": uint64(SpecInt(layoutSpec)), "SPEC_SSE": uint64(SpecSSE(layoutSpec)), "SPEC_STR": uint64(SpecStr(layoutSpec)),
		"SPEC_STACK": uint64(SpecStack(layoutSpec)), "SPEC_RINT": uint64(SpecRInt(layoutSpec)), "SPEC_RSSE": uint64(SpecRSSE(layoutSpec)),
		"EP_HASH_MUL": hashMul, "EP_HASH_STEP": hashStep,
		"EP_INFLIGHT_MAX": InflightMax, "EP_SITE_MAX": SiteMax,
	}
	sizes := map[string]uintptr{"ep_func": funcSize, "ep_thread": threadSize, "ep_local": localSize, "ep_frame": frameSize, "ep_event": eventSize, "ep_header": HeaderSize, "ep_argplan": 16, "ep_inflight_site": InflightSiteSize}
	seenFields := map[string]int{}
	sc := bufio.NewScanner(strings.NewReader(string(out)))
	for sc.Scan() {
		f := strings.Fields(sc.Text())
		num := func(i int) uint64 {
			v, err := strconv.ParseUint(f[i], 10, 64)
			if err != nil {
				t.Fatalf("bad line %q", sc.Text())
			}
			return v
		}
		switch {
		case strings.HasPrefix(f[0], "const."):
			name := strings.TrimPrefix(f[0], "const.")
			if v, ok := consts[name]; !ok || v != num(1) {
				t.Errorf("constant %s: C %d, Go %d (known %v)", name, num(1), v, ok)
			}
			delete(consts, name)
		case len(f) == 2:
			typ := goTypes[f[0]]
			if typ == nil || uint64(typ.Size()) != num(1) || uint64(sizes[f[0]]) != num(1) {
				t.Errorf("sizeof(%s): C %d, Go %v", f[0], num(1), typ)
			}
		case len(f) == 3:
			sn, fn, _ := strings.Cut(f[0], ".")
			typ := goTypes[sn]
			goName := goField(fn)
			sf, ok := typ.FieldByName(goName)
			if !ok {
				t.Errorf("%s.%s: no Go field %s", sn, fn, goName)
				continue
			}
			if uint64(sf.Offset) != num(1) || uint64(sf.Type.Size()) != num(2) {
				t.Errorf("%s.%s: C offset %d size %d, Go %d %d", sn, fn, num(1), num(2), sf.Offset, sf.Type.Size())
			}
			seenFields[sn]++
		}
	}
	for name := range consts {
		t.Errorf("constant %s not printed by layout.c", name)
	}
	// Every named Go field was compared (blank padding fields aside).
	for sn, typ := range goTypes {
		named := 0
		for i := 0; i < typ.NumField(); i++ {
			if typ.Field(i).Name != "_" {
				named++
			}
		}
		if seenFields[sn] != named {
			t.Errorf("%s: layout.c printed %d fields, Go has %d named fields", sn, seenFields[sn], named)
		}
	}
	if unsafe.Sizeof(Header{}) != HeaderSize {
		t.Errorf("Header is %d bytes", unsafe.Sizeof(Header{}))
	}
}

// goField maps a C field name to its Go name: snake_case to CamelCase with
// the initialisms used in layout.go.
func goField(c string) string {
	special := map[string]string{"tsc_mult": "TSCMult", "tsc0": "TSC0", "exit_tsc": "ExitTSC", "ts": "TS", "tsk": "TSK", "fn": "Fn", "calib_ns": "CalibNs", "argplan": "ArgPlan"}
	if s, ok := special[c]; ok {
		return s
	}
	var b strings.Builder
	for _, p := range strings.Split(c, "_") {
		b.WriteString(strings.ToUpper(p[:1]) + p[1:])
	}
	return b.String()
}
