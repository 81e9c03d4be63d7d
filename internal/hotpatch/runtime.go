package hotpatch

import (
	"context"
	"debug/elf"
	"errors"
	"fmt"
	"os"
	"path/filepath"

	"github.com/edgeprobe/edgeprobe/internal/elfsafe"
	"github.com/edgeprobe/edgeprobe/internal/inject"
	"github.com/edgeprobe/edgeprobe/internal/procfs"
	"github.com/edgeprobe/edgeprobe/internal/procmaps"
	"github.com/edgeprobe/edgeprobe/internal/ptrace"
	"github.com/edgeprobe/edgeprobe/internal/shm"
)

// ErrNoRuntime: the process's probes would call hooks that record nothing
// (glibc's), and loading the runtime was refused (--no-inject) or failed.
var ErrNoRuntime = errors.New("no edgeprobe runtime in the process")

// EnvRuntime names the runtime file when --runtime does not.
const EnvRuntime = "EDGEPROBE_RUNTIME"

// EnvInjectThread names the thread (its comm) to borrow for the load, for
// tests that must interrupt a given thread's system call.
const EnvInjectThread = "EDGEPROBE_INJECT_THREAD"

// EnvTestKillAt makes hotpatch SIGKILL itself at one step of a runtime
// load (inject.Options.KillAt), for tests of a hotpatch killed mid-load;
// "trap-reaped": right after its tracer reaped a thread's SIGTRAP stop at
// an armed int3 (ptrace.Options.KillAtTrap, TestKilledAfterTrapReaped).
const EnvTestKillAt = "EDGEPROBE_TEST_KILL_AT"

// RuntimeFile is the runtime's file name next to the hotpatch executable.
const RuntimeFile = "libedgeprobe.so"

// RuntimeOptions say what EnsureRuntime may do.
type RuntimeOptions struct {
	NoInject bool   // refuse instead of loading (--no-inject)
	File     string // --runtime; else $EDGEPROBE_RUNTIME; else libedgeprobe.so next to the executable
	WaitLock bool   // wait for another hotpatch working on the process

	// check, when set, is asked right before the runtime is loaded or the
	// slots routed, with the process's objects: an error refuses the
	// request there, with nothing changed (Apply: its request's checks).
	check func(objs []procmaps.Object) error
}

// ForRequest returns o with the check a load made for a request makes
// first (D83): the lists in probeFiles (none: a scan of the process's
// objects) are read and matched, and actions must select probes that pass
// the checks Apply makes before it writes; else EnsureRuntime refuses with
// that error before it loads or routes anything. No actions: no check.
func (o RuntimeOptions) ForRequest(pid int, probeFiles []string, actions []Action) RuntimeOptions {
	if len(actions) > 0 {
		o.check = func(objs []procmaps.Object) error {
			return checkRequest(Request{PID: pid, ProbeFiles: probeFiles, Actions: actions}, procfs.Via(pid), objs)
		}
	}
	return o
}

// RuntimeStatus is what EnsureRuntime found and did.
type RuntimeStatus struct {
	Present bool           `json:"present"`          // the runtime records the process's probes (now)
	Loaded  bool           `json:"loaded"`           // it was loaded by this call
	Routed  int            `json:"routed"`           // hook slots routed to it by this call
	Foreign []inject.Slot  `json:"foreign"`          // slots bound to the program's own hooks: left alone
	Load    *inject.Result `json:"load,omitempty"`   // how the load went
	Note    string         `json:"note,omitempty"`   // the one line for stderr, if any
	Static  bool           `json:"static,omitempty"` // a static program (the runtime must be linked in)

	// objects are the process's objects as the check read them under the
	// caller's lock, when nothing was loaded or routed since: the request
	// that holds that lock takes its targets from them (open) instead of
	// reading the maps and every object again.
	objects []procmaps.Object
}

// EnsureRuntime is the one place that decides, for pid, "runtime present",
// "load it (and route the hooks to it)" or "refuse". Hook slots that point
// to glibc's hooks (or are not bound yet) are routed to the runtime, which is
// loaded first if the process does not map it; slots bound to hooks the
// program defines itself are left alone and reported. A process with no hook
// slot at all (not instrumented, or a static program that links its hooks)
// is reported as it is: nothing to do. With NoInject, slots to route are an
// ErrNoRuntime error instead.
func EnsureRuntime(ctx context.Context, pid int, opts RuntimeOptions) (*RuntimeStatus, error) {
	return ensureRuntime(ctx, pid, opts, nil)
}

// EnsureRuntime is EnsureRuntime for the session's process under the lock
// the session holds (its tracer), so no other hotpatch can take the
// process between the session's commands and the load. A load upgrades
// the session's tracer to every thread (inject.Load), which it then stays.
// Not inside Batch (ErrNeedsFullAttach: run it outside).
func (s *Session) EnsureRuntime(ctx context.Context, opts RuntimeOptions) (*RuntimeStatus, error) {
	if s.tracer == nil {
		return nil, fmt.Errorf("pid %d: %w", s.pid, ptrace.ErrDetached)
	}
	if s.inBatch {
		return nil, ErrNeedsFullAttach
	}
	st, err := ensureRuntime(ctx, s.pid, opts, &Lock{t: s.tracer, via: s.pid, fd: -1})
	if st != nil && st.Load != nil {
		s.full = true // inject.Load upgraded the tracer
	}
	if err == nil && s.region == nil {
		if r, rerr := shm.OpenPID(s.pid); rerr == nil {
			if r.Writable() {
				s.region = r
			} else {
				r.Close()
			}
		}
	}
	return st, err
}

// ensureRuntime is EnsureRuntime; held, when set, is the lock the caller
// already holds (a Session's), used instead of taking one.
func ensureRuntime(ctx context.Context, pid int, opts RuntimeOptions, held *Lock) (*RuntimeStatus, error) {
	// Looking takes no lock (stats may run beside a trace that holds it);
	// changing anything does, and looks again under it. Looking goes
	// through a live thread when the main thread has exited (D95); the
	// lock is taken by the process's pid.
	proc := pid
	if held == nil {
		pid = procfs.Via(pid)
	}
	p, err := inject.Inspect(pid)
	if err != nil {
		if errors.Is(err, os.ErrPermission) {
			return nil, fmt.Errorf("pid %d: reading its memory map needs ptrace rights (the same user, or CAP_SYS_PTRACE): %w", pid, err)
		}
		return nil, err
	}
	st := &RuntimeStatus{Foreign: p.Foreign(), Static: p.Static}
	if held != nil {
		st.objects = p.Objects
	}
	if p.Static {
		return st, staticRuntime(pid, st, opts)
	}
	if len(p.NeedRouting()) == 0 {
		st.Present = p.Runtime != nil
		return st, nil
	}
	// A descriptor named like the runtime's region that is not a region of
	// this process (planted, or inherited from another) means something we
	// cannot vouch for runs there: refuse rather than load beside it.
	if p.Runtime == nil {
		if r, err := shm.OpenPID(pid); err == nil {
			r.Close()
		} else if errors.Is(err, shm.ErrUntrusted) {
			return st, err
		}
	}
	lock := held
	if !opts.NoInject && lock == nil {
		if lock, err = AcquireLockContext(ctx, proc, opts.WaitLock); err != nil {
			return st, err
		}
		defer lock.Release()
		pid = lock.Pid()
		// Looked before the lock: look again under it.
		if p, err = inject.Inspect(pid); err != nil {
			return st, err
		}
	}
	need := p.NeedRouting()
	if len(need) == 0 {
		st.Present = p.Runtime != nil
		return st, nil
	}
	if opts.NoInject {
		if p.Runtime != nil {
			return st, fmt.Errorf("pid %d: %d hook slots (first: %s %s) are not routed to its runtime and --no-inject was given: their probes would record nothing: %w", pid, len(need), filepath.Base(need[0].Object), need[0].Hook, ErrNoRuntime)
		}
		return st, fmt.Errorf("pid %d was not started with the edgeprobe runtime and --no-inject was given: its probes would call glibc's empty hooks and record nothing: %w", pid, ErrNoRuntime)
	}
	if err := p.Preflight(); err != nil {
		return st, err
	}
	var runtime []byte
	if p.Runtime == nil {
		file, err := runtimePath(opts.File)
		if err != nil {
			return st, err
		}
		if runtime, err = inject.ReadRuntime(file, p.UID); err != nil {
			return st, err
		}
	}
	if opts.check != nil {
		// The request this load is for must not be refused after it.
		if err := opts.check(p.Objects); err != nil {
			return st, err
		}
	}
	// Round 1 loads (or routes); a slot that the lazy binder was filling in
	// at the same moment can end up pointing to glibc again: route again.
	for round := 0; round < 3 && len(need) > 0; round++ {
		st.objects = nil // the load maps the runtime: the objects change
		res, err := inject.Load(ctx, p, inject.Options{Runtime: runtime, Prefer: os.Getenv(EnvInjectThread), KillAt: os.Getenv(EnvTestKillAt), Tracer: lock.Tracer()})
		if st.Load == nil {
			st.Load = res
		}
		if err != nil {
			return st, err
		}
		if runtime != nil {
			st.Loaded = true
		}
		runtime = nil
		if p, err = inject.Inspect(pid); err != nil {
			return st, err
		}
		if p.Runtime == nil {
			return st, fmt.Errorf("pid %d: the runtime is not mapped after loading it: %w", pid, inject.ErrLoad)
		}
		st.Routed += res.Entries - len(p.NeedRouting())
		need = p.NeedRouting()
	}
	if len(need) > 0 {
		return st, fmt.Errorf("pid %d: %d hook slots still point to glibc after 3 rounds (first: %s %s at %#x): %w", pid, len(need), filepath.Base(need[0].Object), need[0].Hook, need[0].Addr, ErrNoRuntime)
	}
	st.Present = true
	if st.Loaded {
		st.Note = fmt.Sprintf("loaded the edgeprobe runtime into pid %d", pid)
	} else {
		st.Note = fmt.Sprintf("routed %d hook slots of pid %d to its edgeprobe runtime", st.Routed, pid)
	}
	return st, nil
}

// staticRuntime decides for a static program: its hooks are linked in, so
// the runtime is present when it made its region; glibc's own hooks (one
// no-op under both names) mean nothing can record, and nothing can be
// loaded: refuse, naming the supported path. A stripped program does not say
// whose hooks it has: it is left as it is.
func staticRuntime(pid int, st *RuntimeStatus, opts RuntimeOptions) error {
	if r, err := shm.OpenPID(pid); err == nil {
		r.Close()
		st.Present = true
		return nil
	}
	main, err := procmaps.Main(pid)
	if err != nil {
		return err
	}
	f, err := procmaps.Open(pid, main)
	if err != nil {
		return err
	}
	defer f.Close()
	ef, err := elfsafe.NewFile(f)
	if err != nil {
		return fmt.Errorf("%s: %v: %w", main.Path, err, procmaps.ErrNotELF)
	}
	syms, _ := ef.Symbols()
	at := map[string]uint64{}
	for _, s := range syms {
		if s.Section != elf.SHN_UNDEF && s.Value != 0 {
			at[s.Name] = s.Value
		}
	}
	enter, ok1 := at["__cyg_profile_func_enter"]
	exit, ok2 := at["__cyg_profile_func_exit"]
	if ok1 && ok2 && enter == exit {
		return fmt.Errorf("pid %d is statically linked with glibc's empty hooks, and a static program cannot load a library: link libedgeprobe.a into it (-Wl,--whole-archive libedgeprobe.a -Wl,--no-whole-archive): %w", pid, inject.ErrStatic)
	}
	return nil
}

// runtimePath finds the runtime file: the flag, the environment, or next to
// the executable.
func runtimePath(flag string) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if env := os.Getenv(EnvRuntime); env != "" {
		return env, nil
	}
	exe, err := os.Executable()
	if err != nil {
		return "", fmt.Errorf("no runtime file: give --runtime or %s (%v): %w", EnvRuntime, err, ErrNoRuntime)
	}
	if exe, err = filepath.EvalSymlinks(exe); err == nil {
		file := filepath.Join(filepath.Dir(exe), RuntimeFile)
		if _, err := os.Stat(file); err == nil {
			return file, nil
		}
		return "", fmt.Errorf("no runtime file: %s does not exist; give --runtime or %s: %w", file, EnvRuntime, ErrNoRuntime)
	}
	return "", fmt.Errorf("no runtime file: give --runtime or %s: %w", EnvRuntime, ErrNoRuntime)
}
