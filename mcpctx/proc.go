package mcpctx

import (
	"errors"
	"fmt"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"time"
)

// proc is a stdio MCP server process, started in its own process group so
// that stopping it also stops everything it started.
//
// The pipes are ours (os.Pipe), not exec's, so Wait never blocks on a
// grandchild holding a copy of stdout, and closing our read ends unblocks
// the transport's reader.
type proc struct {
	cmd     *exec.Cmd
	stdin   *os.File // write end, handed to the transport (which closes it)
	stdout  *os.File // read end, handed to the transport
	stderr  *os.File // read end, drained into tail
	tail    tailBuffer
	drained chan struct{} // closed when the stderr drain returns

	exited  chan struct{} // closed when Wait returns
	waitErr error

	stopOnce sync.Once
	stopErr  error
}

// startProc starts cfg's command with stdin/stdout/stderr on fresh pipes,
// in a new process group.
func startProc(cfg ServerConfig) (*proc, error) {
	inR, inW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	outR, outW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		return nil, err
	}
	errR, errW, err := os.Pipe()
	if err != nil {
		inR.Close()
		inW.Close()
		outR.Close()
		outW.Close()
		return nil, err
	}
	cmd := exec.Command(cfg.Command, cfg.Args...)
	cmd.Env = os.Environ()
	for k, v := range cfg.Env {
		cmd.Env = append(cmd.Env, k+"="+v)
	}
	cmd.Stdin, cmd.Stdout, cmd.Stderr = inR, outW, errW
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	err = cmd.Start()
	// The child has its copies; ours of the child's ends must go either way.
	inR.Close()
	outW.Close()
	errW.Close()
	if err != nil {
		inW.Close()
		outR.Close()
		errR.Close()
		return nil, fmt.Errorf("start %q: %w", cfg.Command, err)
	}
	p := &proc{cmd: cmd, stdin: inW, stdout: outR, stderr: errR, drained: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		defer close(p.drained)
		buf := make([]byte, 4096)
		for {
			n, err := errR.Read(buf)
			p.tail.Write(buf[:n])
			if err != nil {
				return
			}
		}
	}()
	go func() {
		p.waitErr = cmd.Wait()
		close(p.exited)
	}()
	return p, nil
}

// stop ends the process tree within d: stdin closed (the caller's
// transport Close already did; we close again harmlessly), wait, SIGTERM to
// the group, wait, SIGKILL to the group, reap. It always reaps the leader
// (no zombie) unless the kernel refuses to kill it, and always releases the
// pipes and joins the stderr drain. Idempotent.
func (p *proc) stop(d time.Duration) error {
	p.stopOnce.Do(func() { p.stopErr = p.doStop(d) })
	return p.stopErr
}

func (p *proc) doStop(d time.Duration) error {
	deadline := time.Now().Add(d)
	pgid := p.cmd.Process.Pid // Setpgid: the group id is the leader's pid
	_ = p.stdin.Close()

	// 1. stdin closed: a well-behaved server exits by itself.
	p.waitExit(until(deadline, 2*d/5))

	// 2. SIGTERM to the whole group (the leader, if still alive, and its
	// children, which outlive a leader that exits on EOF).
	if err := syscall.Kill(-pgid, syscall.SIGTERM); err == nil {
		if !p.exitedNow() {
			p.waitExit(until(deadline, 2*d/5))
		} else {
			p.waitGroupGone(pgid, until(deadline, min(d/5, 500*time.Millisecond)))
		}
	}

	// 3. SIGKILL to whatever is left of the group.
	_ = syscall.Kill(-pgid, syscall.SIGKILL)
	var err error
	t := time.NewTimer(max(time.Until(deadline), 0) + time.Second) // SIGKILL cannot be ignored
	select {
	case <-p.exited:
	case <-t.C:
		err = errors.New("process did not exit after SIGKILL")
	}
	t.Stop()

	// Release our ends; the transport's reader and our drain return.
	_ = p.stdout.Close()
	_ = p.stderr.Close()
	<-p.drained
	return err
}

func (p *proc) exitedNow() bool {
	select {
	case <-p.exited:
		return true
	default:
		return false
	}
}

func (p *proc) waitExit(d time.Duration) {
	if d <= 0 {
		return
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-p.exited:
	case <-t.C:
	}
}

// waitGroupGone polls until no process is left in the group or d passes.
func (p *proc) waitGroupGone(pgid int, d time.Duration) {
	end := time.Now().Add(d)
	for time.Now().Before(end) {
		if err := syscall.Kill(-pgid, 0); errors.Is(err, syscall.ESRCH) {
			return
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// until returns the smaller of want and the time left to deadline.
func until(deadline time.Time, want time.Duration) time.Duration {
	return min(want, time.Until(deadline))
}

// tailBuffer keeps the last bytes written to it.
type tailBuffer struct {
	mu  sync.Mutex
	buf []byte
}

const tailSize = 2048

func (b *tailBuffer) Write(p []byte) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.buf = append(b.buf, p...)
	if len(b.buf) > tailSize {
		b.buf = append([]byte(nil), b.buf[len(b.buf)-tailSize:]...)
	}
}

// lastLine is the last non-empty line written, shortened.
func (b *tailBuffer) lastLine() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	s := string(b.buf)
	for len(s) > 0 {
		i := len(s) - 1
		for i >= 0 && s[i] != '\n' {
			i--
		}
		line := s[i+1:]
		s = s[:max(i, 0)]
		if trimmed := trimSpace(line); trimmed != "" {
			if len(trimmed) > 200 {
				trimmed = trimmed[:200] + "…"
			}
			return trimmed
		}
		if i < 0 {
			break
		}
	}
	return ""
}

func trimSpace(s string) string {
	for len(s) > 0 && (s[0] == ' ' || s[0] == '\t' || s[0] == '\r') {
		s = s[1:]
	}
	for len(s) > 0 && (s[len(s)-1] == ' ' || s[len(s)-1] == '\t' || s[len(s)-1] == '\r') {
		s = s[:len(s)-1]
	}
	return s
}
