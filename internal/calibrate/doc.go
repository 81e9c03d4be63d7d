// Package calibrate is the installation-time test of the paper's section 8.1:
// it measures, on this machine, how long the int3 protocol must wait between
// its phases (T_max) when the wait is all that protects a straddling site,
// and saves the answer where `hotpatch --protocol int3` picks it up.
//
// # The test
//
// A bundled target program (target/stress.c, embedded; compiled at run time with
// the machine's C compiler, $CC or else gcc, clang or cc, into a temporary
// directory) runs N executor threads through five 5-byte call sites: one
// that straddles nothing and one at each cache-line split 1|4, 2|3, 3|2, 4|1.
// A point of the sweep is one (variant, wait, split): the patcher toggles
// that one site between its call and a 5-byte NOP (flip: `e8`<->`3d`)
// TogglesPerPoint times while the executors run it. A torn instruction is
// caught by the target itself: its SIGILL/SIGSEGV/SIGBUS/SIGTRAP/SIGFPE
// handler counts it (stress_torn), reports the signal, PC, fault address,
// the site and the bytes at the PC on stderr, and the thread carries on; an
// iteration whose return values do not add up counts in stress_bad. If the
// target dies anyway, that is one more failure: the target is restarted and
// the point goes on. Nothing but the target can be hurt: it is a child
// process that reads its stdin until EOF, so it also ends if we do.
//
// After a point's last toggle (an even number, so the site ends as a call),
// the patcher waits until every executor has completed two more loops, so
// every torn execution begun during the point has been counted, then reads
// the counters: failures = torn + bad + crashes. The stderr reports of the
// point are kept (the first few verbatim) and their number is recorded next
// to the counter.
//
// # Variants
//
//   - int3 (the calibrated one): xmod.Int3 with NoSync, so the time wait
//     between the phases is all there is: the paper's protocol, the one
//     whose safety depends on T_max. Swept over Options.Waits; a zero wait
//     means no wait at all.
//   - int3+sync (a control): xmod.Int3 with its per-phase Sync (every thread
//     interrupted and resumed, so each executes a serialising return). With
//     Sync the wait is not what makes the protocol safe; these rows show that
//     Sync alone (wait 0) holds. Swept over Options.SyncWaits (default: no
//     wait only), since each toggle costs about a millisecond.
//   - flip (a control): xmod.Flip, one atomic byte per toggle, no wait and no
//     tracer. Expected: no failures.
//
// # The choice
//
// The base wait is the smallest positive wait of the int3 sweep such that it
// and every larger wait of the sweep had zero failures on every split, each
// point having completed at least TogglesPerPoint toggles. (A zero-failure
// "no wait" row does not make no wait the answer: the smallest positive
// wait is the floor.) If the largest wait still failed, there is no answer
// and nothing is saved (ErrNoSafeWait). The recommended wait is the base
// times Margin (default 3, as the paper went from 600 to 3000 ticks, x5, on
// its dual-socket machine; we take x3 on a wait that has already held at
// every larger wait of the sweep).
//
// Zero failures in n toggles bounds the per-toggle failure rate below about
// 3/n at 95% confidence, nothing better: the failure rates seen on this
// machine class before (35 crashes in 67M int3 toggles with 0.1-1 µs waits)
// need tens of millions of toggles per point to show up. A calibration with
// a modest budget is a smoke test of the wait, not a proof; keep the Sync.
//
// A target that dies while traced is reaped by the tracer thread (it shares
// our thread group), so its exit status is lost; the crash report says so
// and keeps its last stderr lines.
//
// Outside the CLI, a real calibration runs from the tests:
//
//	EDGEPROBE_CALIBRATE_TOGGLES=20000 go test -v -timeout 1h -run TestCalibrateSoak ./internal/calibrate
//
// # The file
//
// Result.Save writes JSON (docs: the Result type) with a temporary file and
// a rename, at DefaultPath() unless told otherwise:
// $EDGEPROBE_CALIBRATION if set, else /var/lib/edgeprobe/calibration.json
// for root, else $XDG_STATE_HOME/edgeprobe/calibration.json
// ($HOME/.local/state when XDG_STATE_HOME is unset). Load returns the saved
// wait and whether a calibration exists; a file that exists but does not
// parse is an error, never silently ignored.
package calibrate
