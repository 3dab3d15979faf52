package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/acpserver/acpserver/acp"
)

// binPath is the acpserver binary built once for the whole package (with
// -race when the tests run with -race, so the server is checked too).
var binPath string

func TestMain(m *testing.M) {
	dir, err := os.MkdirTemp("", "acpserver-it-*")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	binPath = filepath.Join(dir, "acpserver")
	args := []string{"build", "-o", binPath}
	if raceEnabled {
		args = append(args, "-race")
	}
	args = append(args, "github.com/acpserver/acpserver/cmd/acpserver")
	build := exec.Command("go", args...)
	build.Stdout, build.Stderr = os.Stderr, os.Stderr
	if err := build.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "building acpserver:", err)
		os.Exit(1)
	}
	code := m.Run()
	if code == 0 {
		if err := goleak.Find(); err != nil {
			fmt.Fprintln(os.Stderr, "goleak:", err)
			code = 1
		}
	}
	os.RemoveAll(dir)
	os.Exit(code)
}

// server is one running acpserver process.
type server struct {
	t      testing.TB
	cmd    *exec.Cmd
	addr   string
	logs   *logBuffer
	exited chan struct{}
	err    error // from Wait, valid after exited
	once   sync.Once
}

// serverOptions start a server with extra flags and environment.
type serverOptions struct {
	Args []string
	Env  []string
}

func startServer(t testing.TB, args ...string) *server {
	return startServerWith(t, serverOptions{Args: args})
}

func startServerWith(t testing.TB, o serverOptions) *server {
	t.Helper()
	args := append([]string{"--listen", "127.0.0.1:0", "--log-format", "json", "--log-level", "debug"}, o.Args...)
	cmd := exec.Command(binPath, args...)
	cmd.Env = append(os.Environ(), o.Env...)
	logs := &logBuffer{addr: make(chan string, 1)}
	cmd.Stdout = logs
	cmd.Stderr = logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start acpserver: %v", err)
	}
	s := &server{t: t, cmd: cmd, logs: logs, exited: make(chan struct{})}
	go func() { s.err = cmd.Wait(); close(s.exited) }()
	t.Cleanup(func() { s.stop(t) })
	select {
	case s.addr = <-logs.addr:
	case <-s.exited:
		t.Fatalf("acpserver exited at start: %v\n%s", s.err, logs.String())
	case <-time.After(30 * time.Second):
		t.Fatalf("acpserver did not report its address\n%s", logs.String())
	}
	return s
}

// stop sends SIGTERM and waits; it reports how long the exit took. A
// server that does not exit in 30s is killed and the test fails.
func (s *server) stop(t testing.TB) (elapsed time.Duration, exitCode int) {
	exitCode = -1
	s.once.Do(func() {
		start := time.Now()
		_ = s.cmd.Process.Signal(syscall.SIGTERM)
		select {
		case <-s.exited:
		case <-time.After(30 * time.Second):
			_ = s.cmd.Process.Kill()
			<-s.exited
			t.Errorf("acpserver did not exit within 30s of SIGTERM\n%s", s.logs.String())
		}
		elapsed = time.Since(start)
		exitCode = s.cmd.ProcessState.ExitCode()
		if exitCode != 0 {
			t.Errorf("acpserver exited with %d\n%s", exitCode, s.logs.String())
		}
		if strings.Contains(s.logs.String(), "WARNING: DATA RACE") {
			t.Errorf("data race in acpserver:\n%s", s.logs.String())
		}
	})
	return elapsed, exitCode
}

func (s *server) url() string { return "ws://" + s.addr + "/acp" }

// snapshot is the /debug/sessions document.
type snapshot struct {
	Connections       int              `json:"connections"`
	Sessions          int              `json:"sessions"`
	MCPClients        int              `json:"mcp_clients"`
	Toolsets          int              `json:"toolsets"`
	InflightPrompts   int              `json:"inflight_prompts"`
	InflightToolCalls int              `json:"inflight_tool_calls"`
	Ended             map[string]int64 `json:"ended"`
}

func (s *server) snapshot(t testing.TB) snapshot {
	t.Helper()
	resp, err := http.Get("http://" + s.addr + "/debug/sessions")
	if err != nil {
		t.Fatalf("GET /debug/sessions: %v", err)
	}
	defer resp.Body.Close()
	var snap snapshot
	if err := json.NewDecoder(resp.Body).Decode(&snap); err != nil {
		t.Fatalf("decode /debug/sessions: %v", err)
	}
	return snap
}

// waitCounts polls /debug/sessions until cond holds or the deadline passes.
func (s *server) waitCounts(t testing.TB, within time.Duration, what string, cond func(snapshot) bool) snapshot {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		snap := s.snapshot(t)
		if cond(snap) {
			return snap
		}
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s never held; last /debug/sessions: %+v", within, what, snap)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// waitIdle waits until no connection, runtime, client, toolset or
// in-flight work is left.
func (s *server) waitIdle(t testing.TB, within time.Duration) snapshot {
	t.Helper()
	return s.waitCounts(t, within, "all counts at zero", func(sn snapshot) bool {
		return sn.Connections == 0 && sn.Sessions == 0 && sn.MCPClients == 0 && sn.Toolsets == 0 &&
			sn.InflightPrompts == 0 && sn.InflightToolCalls == 0
	})
}

// logBuffer collects the server's output and spots its listen address.
type logBuffer struct {
	mu   sync.Mutex
	buf  bytes.Buffer
	line []byte
	addr chan string
	sent bool
}

func (l *logBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.buf.Write(p)
	l.line = append(l.line, p...)
	for {
		i := bytes.IndexByte(l.line, '\n')
		if i < 0 {
			break
		}
		line := l.line[:i]
		if !l.sent {
			var rec struct {
				Msg  string `json:"msg"`
				Addr string `json:"addr"`
			}
			if json.Unmarshal(line, &rec) == nil && rec.Msg == "listening" && rec.Addr != "" {
				l.sent = true
				l.addr <- rec.Addr
			}
		}
		l.line = l.line[i+1:]
	}
	return len(p), nil
}

func (l *logBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.buf.String()
}

// count returns how many log lines carry msg.
func (l *logBuffer) count(msg string) int {
	return strings.Count(l.String(), `"msg":"`+msg+`"`)
}

// message is any JSON-RPC message the client received.
type message struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *acp.Error      `json:"error,omitempty"`
}

// update decodes a session/update notification's params.
func (m message) update() (sessionID, kind string, upd map[string]any) {
	var p struct {
		SessionID string         `json:"sessionId"`
		Update    map[string]any `json:"update"`
	}
	_ = json.Unmarshal(m.Params, &p)
	k, _ := p.Update["sessionUpdate"].(string)
	return p.SessionID, k, p.Update
}

// wire moves whole JSON-RPC messages for a test client: WebSocket text
// frames, or the stdio lines of a child process.
type wire interface {
	writeMsg(b []byte) error
	readMsg(within time.Duration) ([]byte, error)
}

// wsWire is a client's WebSocket.
type wsWire struct{ ws *websocket.Conn }

func (w wsWire) writeMsg(b []byte) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	return w.ws.Write(ctx, websocket.MessageText, b)
}

func (w wsWire) readMsg(within time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(context.Background(), within)
	defer cancel()
	for {
		typ, b, err := w.ws.Read(ctx)
		if err != nil {
			return nil, err
		}
		if typ == websocket.MessageText {
			return b, nil
		}
	}
}

// client is a raw ACP client: it reads every message itself, so tests see
// the exact order in which messages arrive.
type client struct {
	t      testing.TB
	w      wire
	ws     *websocket.Conn // for WebSocket clients
	raw    net.Conn
	connID string
	nextID int
	// onRequest answers requests the server sends (e.g.
	// session/request_permission). Default: method not found.
	onRequest func(m message) (any, *acp.Error)
	closed    bool
}

func dial(t testing.TB, s *server) *client {
	t.Helper()
	c, err := dialErr(s.url(), nil)
	if err != nil {
		t.Fatalf("dial %s: %v", s.url(), err)
	}
	c.t = t
	t.Cleanup(func() { c.close() })
	return c
}

// dialErr dials url with optional headers; the response is returned in the
// error for a refused upgrade.
func dialErr(url string, header http.Header) (*client, error) {
	c := &client{}
	var mu sync.Mutex
	hc := &http.Client{Transport: &http.Transport{
		DialContext: func(ctx context.Context, network, addr string) (net.Conn, error) {
			conn, err := (&net.Dialer{}).DialContext(ctx, network, addr)
			mu.Lock()
			c.raw = conn
			mu.Unlock()
			return conn, err
		},
	}}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	ws, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPClient: hc, HTTPHeader: header})
	if err != nil {
		if resp != nil {
			return nil, &dialError{status: resp.StatusCode, header: resp.Header, err: err}
		}
		return nil, err
	}
	ws.SetReadLimit(64 << 20)
	c.ws = ws
	c.w = wsWire{ws}
	c.connID = resp.Header.Get("Acp-Connection-Id")
	return c, nil
}

type dialError struct {
	status int
	header http.Header
	err    error
}

func (e *dialError) Error() string { return fmt.Sprintf("HTTP %d: %v", e.status, e.err) }

func (c *client) close() {
	if c.closed {
		return
	}
	c.closed = true
	_ = c.ws.Close(websocket.StatusNormalClosure, "")
}

// kill cuts the TCP connection with no close frame, like a crashed client.
func (c *client) kill() {
	c.closed = true
	_ = c.raw.Close()
	_ = c.ws.CloseNow()
}

func (c *client) sendText(s string) {
	c.t.Helper()
	if err := c.w.writeMsg([]byte(s)); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

func (c *client) sendJSON(v any) {
	c.t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		c.t.Fatalf("marshal: %v", err)
	}
	c.sendText(string(b))
}

// send sends a request and returns its id.
func (c *client) send(method string, params any) int {
	c.t.Helper()
	c.nextID++
	c.sendJSON(map[string]any{"jsonrpc": "2.0", "id": c.nextID, "method": method, "params": params})
	return c.nextID
}

func (c *client) notify(method string, params any) {
	c.t.Helper()
	c.sendJSON(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
}

// read returns the next message, or an error (a close, a timeout).
func (c *client) read(within time.Duration) (message, error) {
	b, err := c.w.readMsg(within)
	if err != nil {
		return message{}, err
	}
	var m message
	if err := json.Unmarshal(b, &m); err != nil {
		return message{}, fmt.Errorf("undecodable message %q: %w", b, err)
	}
	return m, nil
}

// await reads until the response to id arrives, answering server requests
// on the way, and returns it with every notification that came before it.
func (c *client) await(id int) (message, []message) {
	c.t.Helper()
	want := fmt.Sprint(id)
	var before []message
	for {
		m, err := c.read(30 * time.Second)
		if err != nil {
			c.t.Fatalf("waiting for response %d: %v", id, err)
		}
		switch {
		case m.Method != "" && m.ID != nil:
			c.answer(m)
			before = append(before, m)
		case m.Method != "":
			before = append(before, m)
		case string(m.ID) == want:
			return m, before
		default:
			c.t.Fatalf("unexpected response %s while waiting for %d", m.ID, id)
		}
	}
}

func (c *client) answer(m message) {
	var result any
	var e *acp.Error
	if c.onRequest != nil {
		result, e = c.onRequest(m)
	} else {
		e = acp.Errorf(acp.CodeMethodNotFound, "test client does not serve %s", m.Method)
	}
	resp := map[string]any{"jsonrpc": "2.0", "id": m.ID}
	if e != nil {
		resp["error"] = e
	} else {
		resp["result"] = result
	}
	c.sendJSON(resp)
}

// call sends a request and waits for its answer; result may be nil.
func (c *client) call(method string, params, result any) (*acp.Error, []message) {
	c.t.Helper()
	resp, before := c.await(c.send(method, params))
	if resp.Error != nil {
		return resp.Error, before
	}
	if result != nil {
		if err := json.Unmarshal(resp.Result, result); err != nil {
			c.t.Fatalf("%s: decode result %s: %v", method, resp.Result, err)
		}
	}
	return nil, before
}

// mustCall is call that fails the test on a JSON-RPC error.
func (c *client) mustCall(method string, params, result any) []message {
	c.t.Helper()
	e, before := c.call(method, params, result)
	if e != nil {
		c.t.Fatalf("%s: %v", method, e)
	}
	return before
}

func (c *client) initialize() acp.InitializeResponse {
	c.t.Helper()
	var r acp.InitializeResponse
	c.mustCall("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}}, &r)
	return r
}

func (c *client) newSession(cwd string, servers ...map[string]any) string {
	c.t.Helper()
	if servers == nil {
		servers = []map[string]any{}
	}
	var r acp.NewSessionResponse
	c.mustCall("session/new", map[string]any{"cwd": cwd, "mcpServers": servers}, &r)
	if r.SessionID == "" {
		c.t.Fatal("session/new returned no sessionId")
	}
	return r.SessionID
}

func textPrompt(sid, text string) map[string]any {
	return map[string]any{"sessionId": sid, "prompt": []map[string]any{{"type": "text", "text": text}}}
}

// prompt runs a turn and returns its stop reason and the updates before
// the response.
func (c *client) prompt(sid, text string) (acp.StopReason, []message) {
	c.t.Helper()
	var r acp.PromptResponse
	before := c.mustCall("session/prompt", textPrompt(sid, text), &r)
	return r.StopReason, before
}

// startHeldPrompt starts a turn that holds (/sleep 60s) and returns its
// request id once its first update shows it is running.
func (c *client) startHeldPrompt(sid string) int {
	c.t.Helper()
	id := c.send("session/prompt", textPrompt(sid, "/sleep 60s"))
	if m, err := c.read(10 * time.Second); err != nil || m.Method != "session/update" {
		c.t.Fatalf("held prompt did not start: %+v %v", m, err)
	}
	return id
}

// rawUpdates returns the update payloads of the session/update
// notifications among msgs, as sent.
func rawUpdates(msgs []message) []json.RawMessage {
	var out []json.RawMessage
	for _, m := range msgs {
		if m.Method != "session/update" {
			continue
		}
		var p struct {
			Update json.RawMessage `json:"update"`
		}
		_ = json.Unmarshal(m.Params, &p)
		out = append(out, p.Update)
	}
	return out
}

// agentText concatenates the agent_message_chunk texts among msgs.
func agentText(msgs []message) string {
	var sb strings.Builder
	for _, m := range msgs {
		if _, kind, u := m.update(); kind == "agent_message_chunk" {
			if content, ok := u["content"].(map[string]any); ok {
				s, _ := content["text"].(string)
				sb.WriteString(s)
			}
		}
	}
	return sb.String()
}

// expectClose reads until the server closes the connection and returns
// the close code (-1 if the socket ended without a close frame).
func (c *client) expectClose(within time.Duration) (websocket.StatusCode, []message) {
	c.t.Helper()
	var got []message
	for {
		m, err := c.read(within)
		if err != nil {
			c.closed = true
			return websocket.CloseStatus(err), got
		}
		got = append(got, m)
	}
}

// countReason counts "session ended" log lines with the given reason.
func countReason(logs, reason string) int {
	n := 0
	for _, line := range strings.Split(logs, "\n") {
		var rec struct {
			Msg    string `json:"msg"`
			Reason string `json:"reason"`
		}
		if json.Unmarshal([]byte(line), &rec) == nil && rec.Msg == "session ended" && rec.Reason == reason {
			n++
		}
	}
	return n
}

// followUps reads the want notifications the server sends for sid after a
// response (such as MCP start failures reported after session/new).
func (c *client) followUps(sid string, want int) []message {
	c.t.Helper()
	var got []message
	for len(got) < want {
		m, err := c.read(10 * time.Second)
		if err != nil {
			c.t.Fatalf("after %d of %d follow-ups: %v", len(got), want, err)
		}
		if id, _, _ := m.update(); m.Method != "session/update" || id != sid {
			c.t.Fatalf("unexpected message while reading follow-ups for %q: %+v", sid, m)
		}
		got = append(got, m)
	}
	return got
}
