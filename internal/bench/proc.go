package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"time"
)

// Target is a running benchmark target that speaks the line protocol of the
// bench/*.c programs: "ready PID" first, then one answer line per command.
type Target struct {
	Cmd    *exec.Cmd
	Pid    int
	stdin  io.WriteCloser
	lines  chan string
	stderr *strings.Builder
	done   chan error
}

// Start runs argv with extra environment and waits for its "ready" line.
func Start(ctx context.Context, env []string, argv ...string) (*Target, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.Env = append(os.Environ(), env...)
	in, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	t := &Target{Cmd: cmd, stdin: in, lines: make(chan string, 64), stderr: &strings.Builder{}, done: make(chan error, 1)}
	cmd.Stderr = t.stderr
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	go func() {
		sc := bufio.NewScanner(out)
		for sc.Scan() {
			t.lines <- sc.Text()
		}
		close(t.lines)
		t.done <- cmd.Wait()
	}()
	line, err := t.ReadLine(ctx, 30*time.Second)
	if err != nil {
		t.Kill()
		return nil, err
	}
	f := strings.Fields(line)
	if len(f) != 2 || f[0] != "ready" {
		t.Kill()
		return nil, fmt.Errorf("%s: want \"ready PID\", got %q", argv[0], line)
	}
	t.Pid, _ = strconv.Atoi(f[1])
	return t, nil
}

// ReadLine returns the next line of output.
func (t *Target) ReadLine(ctx context.Context, timeout time.Duration) (string, error) {
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	select {
	case l, ok := <-t.lines:
		if !ok {
			return "", fmt.Errorf("%s exited early: %v %s", t.Cmd.Path, t.wait(), strings.TrimSpace(t.stderr.String()))
		}
		if strings.HasPrefix(l, "torn ") {
			return "", fmt.Errorf("%s: a thread executed a torn site (%s)", t.Cmd.Path, l)
		}
		return l, nil
	case <-tm.C:
		return "", fmt.Errorf("%s: no output within %v", t.Cmd.Path, timeout)
	case <-ctx.Done():
		return "", ctx.Err()
	}
}

func (t *Target) wait() error {
	select {
	case err := <-t.done:
		t.done <- err
		return err
	case <-time.After(5 * time.Second):
		return errors.New("still running")
	}
}

// Send writes one command line.
func (t *Target) Send(cmd string) error {
	_, err := io.WriteString(t.stdin, cmd+"\n")
	return err
}

// Ask sends a command and returns its answer line.
func (t *Target) Ask(ctx context.Context, cmd string) (string, error) {
	if err := t.Send(cmd); err != nil {
		return "", err
	}
	return t.ReadLine(ctx, 60*time.Second)
}

// Counts is the "calls C enters E exits X [cpu NS]" answer.
type Counts struct{ Calls, Enters, Exits, CPUNs uint64 }

// Counts asks a toggle or many target for its counters.
func (t *Target) Counts(ctx context.Context) (Counts, error) {
	l, err := t.Ask(ctx, "calls")
	if err != nil {
		return Counts{}, err
	}
	return parseCounts(l)
}

func parseCounts(l string) (Counts, error) {
	var c Counts
	f := strings.Fields(l)
	if len(f) < 6 || len(f)%2 != 0 || f[0] != "calls" {
		return c, fmt.Errorf("bad counts line %q", l)
	}
	for i := 0; i < len(f); i += 2 {
		v, err := strconv.ParseUint(f[i+1], 10, 64)
		if err != nil {
			return c, fmt.Errorf("bad counts line %q: %v", l, err)
		}
		switch f[i] {
		case "calls":
			c.Calls = v
		case "enters":
			c.Enters = v
		case "exits":
			c.Exits = v
		case "cpu":
			c.CPUNs = v
		}
	}
	return c, nil
}

// Quit asks the target to stop, returns its final counts and waits for it.
func (t *Target) Quit(ctx context.Context) (Counts, error) {
	l, err := t.Ask(ctx, "quit")
	if err != nil {
		t.Kill()
		return Counts{}, err
	}
	c, err := parseCounts(l)
	t.stdin.Close()
	if werr := t.wait(); werr != nil && err == nil {
		err = fmt.Errorf("%s: %v %s", t.Cmd.Path, werr, strings.TrimSpace(t.stderr.String()))
	}
	return c, err
}

// Finish closes stdin (the "go" or EOF) and collects the remaining output.
func (t *Target) Finish(ctx context.Context, timeout time.Duration) ([]string, error) {
	var out []string
	tm := time.NewTimer(timeout)
	defer tm.Stop()
	for {
		select {
		case l, ok := <-t.lines:
			if !ok {
				err := t.wait()
				if err != nil {
					err = fmt.Errorf("%s: %v %s", t.Cmd.Path, err, strings.TrimSpace(t.stderr.String()))
				}
				return out, err
			}
			out = append(out, l)
		case <-tm.C:
			t.Kill()
			return out, fmt.Errorf("%s: still running after %v", t.Cmd.Path, timeout)
		case <-ctx.Done():
			t.Kill()
			return out, ctx.Err()
		}
	}
}

// Kill ends the target (only this process, by its pid).
func (t *Target) Kill() {
	if t.Cmd.Process != nil {
		_ = t.Cmd.Process.Kill()
	}
	t.stdin.Close()
}
