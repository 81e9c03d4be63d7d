package cli

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/spf13/cobra"

	"github.com/edgeprobe/edgeprobe/internal/hotpatch"
	"github.com/edgeprobe/edgeprobe/internal/probelist"
)

// sessionBatch is how many commands already waiting on stdin one Batch
// runs, between two flushes of the results (a script that waits for each
// result gets each at once; one that streams gets them in bursts).
const sessionBatch = 1024

func newSessionCmd(stdout, stderr io.Writer, inj *injectFlags) *cobra.Command {
	var (
		tf       targetFlags
		protocol string
		waitLock bool
	)
	cmd := &cobra.Command{
		Use:   "session --pid N [--probes FILE]... [--protocol P]",
		Short: "Toggle probes from a script: one command per stdin line, one JSON result per line",
		Long: `session attaches once and then reads commands from stdin, one per line, and writes one
JSON object per line to stdout for each, in order:

  enable SEL... [--kind entry|exit|both] [--provider cyg|fentry|all]
  disable SEL... [--kind ...] [--provider ...]
  stats       the session's counts: commands, toggles, errors, elapsed time
  quit        end the session (as end of input does)

SEL is what hotpatch --enable takes (a name, a glob, id:N). Blank lines and lines starting
with # are skipped; a line longer than 1 MiB is not run (its result says so, exit 2). A result is {"line":N,"ok":true,"command":"enable","changed":C,
"unchanged":U,"elapsed_ns":T}; a bad or failed command gives {"line":N,"ok":false,
"error":"...","exit":E} (E as hotpatch's exit status would be) and the session goes on.
Commands already waiting on stdin are carried out together, each as a separate hotpatch
call would (the same checks, all or nothing per command; a command right after one on the
same probes checks its sites against that command's read-back instead of reading them
again: docs/protocols.md), and their results written together: stream commands for
throughput, or wait for each result.

The session holds the process (its attach is the per-process lock) from start to end, so
no other hotpatch interleaves. Before its first enable, as an enabling hotpatch call does,
it makes sure the process runs the runtime, loading it if need be under the session's own
attach (--no-inject makes that enable fail instead; docs/injection.md); a session that only
disables never loads it. End of input, quit, SIGINT, SIGTERM, SIGHUP and SIGQUIT end it
cleanly: the command in progress finishes (or rolls back, per its protocol), the tracer
detaches, probes stay as the commands left them. Exit status: 0 if the session ran
(whatever its commands' results), 1 if it could not start or stdout failed, 2 usage,
4 the process does not exist or exited (the command that found it gone gets its result
line first).`,
		Example: `  printf 'enable handle_*\nstats\ndisable *\n' | hotpatch session --pid 4242
  coproc hotpatch session --pid 4242; echo 'enable lookup' >&${COPROC[1]}; read -r r <&${COPROC[0]}`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if err := tf.check(); err != nil {
				return err
			}
			return runSession(tf, protocol, waitLock, inj, cmd.InOrStdin(), stdout, stderr)
		},
	}
	tf.register(cmd)
	_ = cmd.Flags().MarkHidden("json") // the results are JSON lines whatever it says
	cmd.Flags().StringVar(&protocol, "protocol", hotpatch.ProtoAuto, "auto, flip, int3, int3-async or stop, for every command")
	cmd.Flags().BoolVar(&waitLock, "wait", false, "if another hotpatch works on the process, wait for it instead of failing")
	return cmd
}

// runSession is `hotpatch session` and `hotpatch --commands FILE`.
func runSession(tf targetFlags, protocol string, waitLock bool, inj *injectFlags, in io.Reader, stdout, stderr io.Writer) error {
	switch protocol {
	case hotpatch.ProtoAuto, hotpatch.ProtoFlip, hotpatch.ProtoInt3, hotpatch.ProtoInt3Async, hotpatch.ProtoStop:
	default:
		return usagef("--protocol must be auto, flip, int3, int3-async or stop, not %q", protocol)
	}
	wait, err := int3Wait(protocol, stderr)
	if err != nil {
		return err
	}
	ctx, stop := signalContext()
	defer stop()
	// A session's live heap is its targets; each toggle leaves a few
	// hundred bytes of garbage. Collecting at 8x the live heap instead of
	// 2x costs a few MiB and takes most of the collector out of a toggle.
	defer debug.SetGCPercent(debug.SetGCPercent(800))
	s, err := hotpatch.OpenContext(ctx, tf.pid, tf.probes, waitLock)
	if err != nil {
		return classify(err)
	}
	// Held from the start, as the lock is: the runtime's SIGTRAP handler
	// repairs nothing while a session runs, wherever it runs from (D101).
	if err := s.Hold(); err != nil {
		s.Close()
		return classify(err)
	}
	s.SetBrief(true) // results carry counts, not sites
	sess := &scriptSession{s: s, protocol: protocol, wait: wait, start: time.Now(), inj: inj, stderr: stderr}
	err = sess.serve(ctx, in, stdout)
	if cerr := s.Close(); cerr != nil && err == nil && sess.gone == nil {
		err = cerr
	}
	if err == nil && sess.gone != nil {
		err = classify(sess.gone)
	}
	return err
}

// scriptSession is one `hotpatch session`: its Session and its counts.
type scriptSession struct {
	s        *hotpatch.Session
	protocol string
	wait     time.Duration
	start    time.Time
	line     int
	commands int
	toggles  int
	errors   int
	quit     bool
	gone     error // the process exited: the session ends with hotpatch's exit status 4
	// parsed remembers the actions of each enable/disable line seen (a
	// script repeats the same few lines), so a repeated line is not split
	// and parsed again.
	parsed  map[string]parsedLine
	enc     []byte          // a result line being encoded
	results []sessionResult // a batch's results, reused by the next batch
	cur     sessionResult   // the result of a repeated line, until run copies it
	// The runtime is made sure of (loaded if need be) before the first
	// enable, as an enabling hotpatch call does; a session that only
	// disables never loads it (D48).
	inj       *injectFlags
	stderr    io.Writer
	runtimeOK bool
}

type parsedLine struct {
	verb    string
	actions []hotpatch.Action
}

// appendJSON appends r as json.Marshal would write it: by hand for the
// plain result of an enable or disable that succeeded (the line a streaming
// script gets 100,000 times a second), through json.Marshal otherwise.
// TestSessionResultJSON holds the two to the same bytes.
func (r *sessionResult) appendJSON(b []byte) ([]byte, error) {
	if r.OK && r.Error == "" && r.Exit == 0 && r.Commands == nil && r.Toggles == nil && r.Errors == nil && r.SessionNS == nil &&
		r.Warnings == nil && r.Repaired == nil && (r.Command == "enable" || r.Command == "disable") {
		b = append(b, `{"line":`...)
		b = strconv.AppendInt(b, int64(r.Line), 10)
		b = append(b, `,"ok":true,"command":"`...)
		b = append(b, r.Command...)
		b = append(b, `","changed":`...)
		b = strconv.AppendInt(b, int64(r.Changed), 10)
		b = append(b, `,"unchanged":`...)
		b = strconv.AppendInt(b, int64(r.Unchanged), 10)
		b = append(b, `,"elapsed_ns":`...)
		b = strconv.AppendInt(b, r.ElapsedNS, 10)
		return append(b, '}'), nil
	}
	j, err := json.Marshal(r)
	return append(b, j...), err
}

type sessionResult struct {
	Line      int    `json:"line"`
	OK        bool   `json:"ok"`
	Command   string `json:"command,omitempty"`
	Changed   int    `json:"changed"`
	Unchanged int    `json:"unchanged"`
	ElapsedNS int64  `json:"elapsed_ns"`
	Error     string `json:"error,omitempty"`
	Exit      int    `json:"exit,omitempty"`
	// stats only
	Commands  *int     `json:"commands,omitempty"`
	Toggles   *int     `json:"toggles,omitempty"`
	Errors    *int     `json:"errors,omitempty"`
	SessionNS *int64   `json:"session_ns,omitempty"`
	Warnings  []string `json:"warnings,omitempty"`
	// Repaired: sites a killed hotpatch had left mid-patch, made whole
	// before this command ran.
	Repaired []hotpatch.RepairNote `json:"repaired,omitempty"`
}

// maxLine bounds one command line. A longer line (a generated script gone
// wrong, a file that is not a script) gets its error result, like any bad
// line, and the session goes on with the next.
const maxLine = 1 << 20

// inputLine is one line of stdin; tooLong: it was longer than maxLine and
// its text was dropped.
type inputLine struct {
	text    string
	tooLong bool
}

// maxSkip bounds what is skipped of one over-long line: past it the input
// is not a stream of commands (a device, a binary file) and reading ends.
const maxSkip = 64 << 20

// errNotCommands: the input holds a "line" longer than maxSkip.
var errNotCommands = fmt.Errorf("a line longer than %d MiB: not a stream of commands", maxSkip>>20)

// readLines sends the lines of in (each without its "\n" or "\r\n"; the
// last one may lack its newline) to out, until end of input or a read
// error: every complete line that one read of in brought is sent together
// (sessionBatch at most), so a script that streams costs one channel send
// and one wake-up per read, not per line.
func readLines(in io.Reader, out chan<- []inputLine) error {
	r := bufio.NewReaderSize(in, 64<<10)
	var buf []byte
	var pending []inputLine
	send := func() {
		if len(pending) > 0 {
			out <- pending
			pending = nil
		}
	}
	defer send()
	tooLong := false
	skipped := 0
	var seen lineTexts
	for {
		// The lines read so far go before a read that may wait for more
		// input: what is buffered holds no complete line.
		if n := r.Buffered(); len(pending) > 0 && (n == 0 || !hasNewline(r, n)) || len(pending) >= sessionBatch {
			send()
		}
		chunk, err := r.ReadSlice('\n')
		if tooLong {
			if skipped += len(chunk); skipped > maxSkip {
				return errNotCommands
			}
		} else {
			if len(buf)+len(chunk) > maxLine+2 { // room for "\r\n"
				tooLong, buf = true, buf[:0]
			} else {
				buf = append(buf, chunk...)
			}
		}
		switch err {
		case bufio.ErrBufferFull:
			continue
		case nil:
		case io.EOF:
			if len(buf) > 0 || tooLong {
				pending = append(pending, inputLine{text: strings.TrimSuffix(string(buf), "\r"), tooLong: tooLong})
			}
			return nil
		default:
			return err
		}
		b := bytes.TrimSuffix(bytes.TrimSuffix(buf, []byte("\n")), []byte("\r"))
		if len(b) > maxLine {
			tooLong = true
		}
		l := ""
		if !tooLong {
			l = seen.text(b)
		}
		pending = append(pending, inputLine{text: l, tooLong: tooLong})
		buf, tooLong, skipped = buf[:0], false, 0
	}
}

// lineTexts hands out a line's text, the same string for a line seen
// before (a script repeats the same few lines): no allocation per line.
type lineTexts map[string]string

// maxLineTexts bounds the lines remembered (a script of distinct lines
// gets a new string each, as without it).
const maxLineTexts = 256

func (m *lineTexts) text(b []byte) string {
	if s, ok := (*m)[string(b)]; ok { // a lookup with string(b) does not allocate
		return s
	}
	s := string(b)
	if *m == nil {
		*m = lineTexts{}
	}
	if len(*m) < maxLineTexts && len(s) <= 256 {
		(*m)[s] = s
	}
	return s
}

// hasNewline reports whether the n bytes r has buffered hold a newline.
func hasNewline(r *bufio.Reader, n int) bool {
	b, _ := r.Peek(n) // buffered already: no read
	return bytes.IndexByte(b, '\n') >= 0
}

// serve reads lines until EOF, quit or ctx, runs each batch of waiting lines
// (sessionBatch at most) and writes their results.
func (ss *scriptSession) serve(ctx context.Context, in io.Reader, out io.Writer) error {
	lines := make(chan []inputLine, 4)
	readErr := make(chan error, 1)
	go func() {
		readErr <- readLines(in, lines)
		close(lines)
	}()
	w := bufio.NewWriterSize(out, 64<<10)
	var waiting []inputLine // read, not yet run
	eof := false
	for !ss.quit && ctx.Err() == nil {
		if len(waiting) == 0 {
			if eof {
				break
			}
			select {
			case <-ctx.Done():
				return w.Flush()
			case ls, ok := <-lines:
				if !ok {
					eof = true
					continue
				}
				waiting = ls
			}
		}
		// Whatever else is already read joins the batch.
	more:
		for !eof && len(waiting) < sessionBatch {
			select {
			case ls, ok := <-lines:
				if !ok {
					eof = true
					break more
				}
				waiting = append(waiting, ls...)
			default:
				break more
			}
		}
		n := min(len(waiting), sessionBatch)
		results := ss.run(ctx, waiting[:n])
		waiting = waiting[n:]
		for i := range results {
			b, err := results[i].appendJSON(ss.enc[:0])
			if err != nil {
				return err
			}
			ss.enc = b
			w.Write(b)
			w.WriteByte('\n')
		}
		if err := w.Flush(); err != nil {
			return fmt.Errorf("writing results: %w", err)
		}
	}
	if eof && !ss.quit && ctx.Err() == nil {
		if err := <-readErr; err != nil {
			w.Flush()
			return fmt.Errorf("reading commands: %w", err)
		}
	}
	return w.Flush()
}

// run carries out a batch of lines: flip-only commands inside one
// Session.Batch (no tracer hand-off), a command that needs every thread
// traced outside it, then the rest in a new Batch.
func (ss *scriptSession) run(ctx context.Context, batch []inputLine) []sessionResult {
	results := ss.results[:0] // serve has written the last batch's
	defer func() { ss.results = results[:0] }()
	for len(batch) > 0 && !ss.quit {
		var retry *inputLine
		err := ss.s.Batch(func() error {
			for len(batch) > 0 && !ss.quit {
				r, again := ss.one(ctx, batch[0], true)
				if again {
					l := batch[0]
					retry = &l
					batch = batch[1:]
					return nil
				}
				batch = batch[1:]
				if r != nil {
					results = append(results, *r)
				}
			}
			return nil
		})
		if err != nil {
			// Attaching failed: every command left fails the same way.
			if hotpatch.Gone(err) {
				// The process exited or ran exec (a thread of a process
				// whose main thread had exited: D95): end, as one() does.
				ss.gone, ss.quit = err, true
			}
			for range batch {
				ss.line++
				ss.errors++
				results = append(results, sessionResult{Line: ss.line, Error: oneLine(err), Exit: exitCode(classify(err))})
			}
			return results
		}
		if retry != nil {
			ss.line-- // one() counted it already
			if r, _ := ss.one(ctx, *retry, false); r != nil {
				results = append(results, *r)
			}
		}
	}
	return results
}

// one carries out one line; nil for a blank or comment line. again: the
// command needs every thread traced and must be run outside Batch.
func (ss *scriptSession) one(ctx context.Context, in inputLine, inBatch bool) (r *sessionResult, again bool) {
	ss.line++
	if in.tooLong {
		ss.commands++
		ss.errors++
		err := usagef("line longer than %d bytes: not run", maxLine)
		return &sessionResult{Line: ss.line, Error: oneLine(err), Exit: exitCode(err)}, false
	}
	line := in.text
	if p, ok := ss.parsed[line]; ok {
		ss.commands++
		// The result in the session's scratch (run copies it): a repeated
		// line, a streaming script's every line, allocates nothing here.
		ss.cur = sessionResult{Line: ss.line, Command: p.verb}
		return ss.apply(ctx, &ss.cur, p.actions, inBatch)
	}
	f := strings.Fields(line)
	if len(f) == 0 || strings.HasPrefix(f[0], "#") {
		return nil, false
	}
	ss.commands++
	res := &sessionResult{Line: ss.line, Command: f[0]}
	fail := func(err error) (*sessionResult, bool) {
		ss.errors++
		if hotpatch.Gone(err) {
			// Nothing more can be done to this process: say so once, end.
			ss.gone, ss.quit = err, true
		}
		res.OK, res.Error, res.Exit = false, oneLine(err), exitCode(classify(err))
		return res, false
	}
	switch f[0] {
	case "quit":
		ss.quit = true
		res.OK = true
		return res, false
	case "stats":
		if len(f) > 1 {
			return fail(usagef("stats takes no arguments"))
		}
		ns := time.Since(ss.start).Nanoseconds()
		c, t, e := ss.commands, ss.toggles, ss.errors
		res.OK, res.Commands, res.Toggles, res.Errors, res.SessionNS = true, &c, &t, &e, &ns
		return res, false
	case "enable", "disable":
	default:
		return fail(usagef("unknown command %q (enable, disable, stats or quit)", f[0]))
	}
	actions, err := parseActions(f[0] == "enable", f[1:])
	if err != nil {
		return fail(err)
	}
	if ss.parsed == nil || len(ss.parsed) >= 4096 {
		ss.parsed = map[string]parsedLine{}
	}
	ss.parsed[line] = parsedLine{verb: f[0], actions: actions}
	return ss.apply(ctx, res, actions, inBatch)
}

// apply carries out one enable or disable command.
func (ss *scriptSession) apply(ctx context.Context, res *sessionResult, actions []hotpatch.Action, inBatch bool) (*sessionResult, bool) {
	fail := func(err error) (*sessionResult, bool) {
		ss.errors++
		if hotpatch.Gone(err) {
			ss.gone, ss.quit = err, true
		}
		res.OK, res.Error, res.Exit = false, oneLine(err), exitCode(classify(err))
		return res, false
	}
	if !ss.runtimeOK && actions[0].Enable {
		if inBatch {
			ss.commands--
			return nil, true // loading needs the tracer outside Batch
		}
		// A command refused anyway must not load the runtime first.
		if err := ss.s.Check(actions, ss.protocol); err != nil {
			return fail(err)
		}
		st, err := ss.s.EnsureRuntime(ctx, hotpatch.RuntimeOptions{NoInject: ss.inj.noInject, File: ss.inj.runtime})
		reportRuntime(st, ss.inj, ss.stderr)
		if err != nil {
			return fail(err)
		}
		ss.runtimeOK = true
	}
	t0 := time.Now()
	ar, err := ss.s.Apply(ctx, actions, ss.protocol, ss.wait)
	if inBatch && errors.Is(err, hotpatch.ErrNeedsFullAttach) {
		ss.commands--
		return nil, true
	}
	// Apply's own time (its start to its read after) when it has one: a
	// clock read a command fewer on the path a streaming script takes.
	if ar != nil && ar.ElapsedNS > 0 {
		res.ElapsedNS = ar.ElapsedNS
	} else {
		res.ElapsedNS = time.Since(t0).Nanoseconds()
	}
	if ar != nil {
		res.Changed, res.Unchanged, res.Warnings, res.Repaired = ar.Changed, ar.Unchanged, ar.Warnings, ar.Repaired
		ss.toggles += ar.Changed
	}
	if err != nil {
		return fail(err)
	}
	if !ar.OK {
		return fail(fmt.Errorf("some sites did not reach the asked state (sites now: %s)", hotpatch.Tally(ar.Sites)))
	}
	res.OK = true
	return res, false
}

// parseActions reads "SEL... [--kind K] [--provider P]" as hotpatch's flags
// would: every selector with the same kind and provider.
func parseActions(enable bool, args []string) ([]hotpatch.Action, error) {
	kind, provider := "both", probelist.ProviderAll
	var sels []string
	for i := 0; i < len(args); i++ {
		a := args[i]
		name, val, hasVal := strings.Cut(a, "=")
		switch name {
		case "--kind", "--provider":
			if !hasVal {
				if i+1 >= len(args) {
					return nil, usagef("%s needs a value", name)
				}
				i++
				val = args[i]
			}
			if name == "--kind" {
				kind = val
			} else {
				provider = val
			}
		default:
			if strings.HasPrefix(a, "-") {
				return nil, usagef("unknown option %q (--kind, --provider)", a)
			}
			sels = append(sels, a)
		}
	}
	if len(sels) == 0 {
		return nil, usagef("nothing to %s: give a selector", map[bool]string{true: "enable", false: "disable"}[enable])
	}
	prov, err := probelist.ParseProvider(provider)
	if err != nil {
		return nil, usageError{err}
	}
	actions := make([]hotpatch.Action, len(sels))
	for i, s := range sels {
		sel, err := probelist.ParseSelector(s, kind)
		if err != nil {
			return nil, usageError{err}
		}
		sel.Provider = prov
		actions[i] = hotpatch.Action{Enable: enable, Selector: sel}
	}
	return actions, nil
}

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }
