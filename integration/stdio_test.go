package integration

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"os/exec"
	"strings"
	"testing"
	"time"
)

// lineProc is a child process spoken to in newline-delimited JSON-RPC on
// its stdin/stdout (acpserver stdio, or acpserver bridge as an IDE sees it).
type lineProc struct {
	*client // send, notify, await, mustCall over lineWire
	t       testing.TB
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	lines   chan string
	raw     chan string // every stdout line, for the "stdout is only JSON" check
	stderr  *logBuffer
	exited  chan struct{}
}

func startLineProc(t testing.TB, args ...string) *lineProc {
	t.Helper()
	cmd := exec.Command(binPath, args...)
	stdin, err := cmd.StdinPipe()
	if err != nil {
		t.Fatal(err)
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	p := &lineProc{t: t, cmd: cmd, stdin: stdin, lines: make(chan string, 1024), raw: make(chan string, 1024),
		stderr: &logBuffer{addr: make(chan string, 1)}, exited: make(chan struct{})}
	p.client = &client{t: t}
	p.client.w = lineWire{p}
	cmd.Stderr = p.stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	readDone := make(chan struct{})
	go func() {
		defer close(readDone)
		sc := bufio.NewScanner(stdout)
		sc.Buffer(make([]byte, 1<<20), 64<<20)
		for sc.Scan() {
			line := sc.Text()
			select {
			case p.raw <- line:
			default: // only the first lines are checked
			}
			p.lines <- line
		}
		close(p.lines)
	}()
	go func() { <-readDone; cmd.Wait(); close(p.exited) }()
	t.Cleanup(func() {
		p.stdin.Close()
		select {
		case <-p.exited:
		case <-time.After(20 * time.Second):
			cmd.Process.Kill()
			<-p.exited
			t.Errorf("%s did not exit after stdin EOF\n%s", args[0], p.stderr.String())
		}
		if strings.Contains(p.stderr.String(), "WARNING: DATA RACE") {
			t.Errorf("data race in acpserver %s:\n%s", args[0], p.stderr.String())
		}
	})
	return p
}

// lineWire is the child's stdin and its stdout lines.
type lineWire struct{ p *lineProc }

func (w lineWire) writeMsg(b []byte) error {
	_, err := w.p.stdin.Write(append(b, '\n'))
	return err
}

func (w lineWire) readMsg(within time.Duration) ([]byte, error) {
	select {
	case line, ok := <-w.p.lines:
		if !ok {
			return nil, fmt.Errorf("stdout closed\n%s", w.p.stderr.String())
		}
		if !json.Valid([]byte(line)) {
			return nil, fmt.Errorf("stdout carried a non-JSON line: %s", line)
		}
		return []byte(line), nil
	case <-time.After(within):
		return nil, fmt.Errorf("no message in %s\n%s", within, w.p.stderr.String())
	}
}

// read returns the next message, failing the test on anything else.
func (p *lineProc) read() message {
	p.t.Helper()
	m, err := p.client.read(30 * time.Second)
	if err != nil {
		p.t.Fatal(err)
	}
	return m
}

// closeStdin ends the IDE's side and returns the exit code.
func (p *lineProc) closeStdin() int {
	p.t.Helper()
	p.stdin.Close()
	select {
	case <-p.exited:
	case <-time.After(20 * time.Second):
		p.t.Fatalf("no exit within 20s of stdin EOF\n%s", p.stderr.String())
	}
	return p.cmd.ProcessState.ExitCode()
}

func TestStdioMode(t *testing.T) {
	p := startLineProc(t, "stdio", "--log-format", "json", "--log-level", "debug")
	var init struct {
		ProtocolVersion int `json:"protocolVersion"`
	}
	p.mustCall("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}}, &init)
	if init.ProtocolVersion != 1 {
		t.Fatalf("initialize: %+v", init)
	}
	var ns struct{ SessionID string }
	p.mustCall("session/new", map[string]any{"cwd": "/tmp/project", "mcpServers": []any{}}, &ns)
	var pr struct{ StopReason string }
	before := p.mustCall("session/prompt", textPrompt(ns.SessionID, "over stdio"), &pr)
	if pr.StopReason != "end_turn" || agentText(before) != "over stdio" {
		t.Fatalf("prompt: %+v %q", pr, agentText(before))
	}

	// A running turn when stdin reaches EOF: the runtime ends with reason
	// disconnected and the process exits 0.
	p.send("session/prompt", textPrompt(ns.SessionID, "/sleep 60s"))
	if m := p.read(); m.Method != "session/update" {
		t.Fatalf("want the turn's first update, got %+v", m)
	}
	if code := p.closeStdin(); code != 0 {
		t.Fatalf("exit code %d\n%s", code, p.stderr.String())
	}
	logs := p.stderr.String()
	if !strings.Contains(logs, `"msg":"session ended"`) || !strings.Contains(logs, `"reason":"disconnected"`) {
		t.Fatalf("no disconnected session end in the logs:\n%s", logs)
	}
	// Logs go to stderr only: every stdout line was a JSON-RPC message
	// (read() fails the test on anything else).
	close(p.raw)
	for line := range p.raw {
		if !strings.HasPrefix(line, `{"jsonrpc":"2.0"`) {
			t.Fatalf("stdout line is not a JSON-RPC message: %q", line)
		}
	}
}
