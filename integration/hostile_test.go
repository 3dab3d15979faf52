package integration

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpserver/acpserver/acp"
)

// TestIdleEvictionEndToEnd: an unused runtime ends with reason idle and
// releases its MCP client; the record stays and the next prompt on the
// same connection rebuilds the runtime transparently.
func TestIdleEvictionEndToEnd(t *testing.T) {
	up := startUpstream(t, "idle")
	s := startServer(t, "--session-idle-ttl", "1s")
	c := dial(t, s)
	c.initialize()
	sid := c.newSession("/tmp/p", httpServerEntry("up", up.url()))
	c.prompt(sid, "hello")
	sn := s.waitCounts(t, 10*time.Second, "idle eviction", func(sn snapshot) bool { return sn.Ended["idle"] == 1 })
	if sn.Sessions != 0 || sn.MCPClients != 0 || sn.Toolsets != 0 {
		t.Fatalf("evicted runtime kept resources: %+v", sn)
	}
	up.waitBalanced(t, 5*time.Second)
	if status, text := c.callTool(sid, "up/whoami", "{}"); status != "completed" || text != "http:idle" {
		t.Fatalf("after rebuild: %s %q", status, text)
	}
	if sn := s.snapshot(t); sn.Sessions != 1 || sn.MCPClients != 1 {
		t.Fatalf("not rebuilt: %+v", sn)
	}
	var list acp.ListSessionsResponse
	c.mustCall("session/list", map[string]any{}, &list)
	if len(list.Sessions) != 1 {
		t.Fatalf("record lost: %+v", list)
	}
	c.close()
	s.waitIdle(t, 5*time.Second)
	up.waitBalanced(t, 5*time.Second)
}

// TestBadSettingsRefuseToBoot: malformed or negative values stop the
// server at start with a message naming the setting.
func TestBadSettingsRefuseToBoot(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  []string
		want string
	}{
		{[]string{"--session-idle-ttl", "soon"}, nil, "session-idle-ttl"},
		{nil, []string{"ACPSERVER_SESSION_IDLE_TTL=-5m"}, "ACPSERVER_SESSION_IDLE_TTL"},
		{nil, []string{"ACPSERVER_SESSION_IDLE_TTL=tomorrow"}, "ACPSERVER_SESSION_IDLE_TTL"},
		{[]string{"--max-connections", "-1"}, nil, "max-connections"},
		{[]string{"--auth-token-file", "/nonexistent/token"}, nil, "auth-token-file"},
	} {
		cmd := exec.Command(binPath, append([]string{"--listen", "127.0.0.1:0"}, tc.args...)...)
		cmd.Env = append(os.Environ(), tc.env...)
		out, err := cmd.CombinedOutput()
		var ee *exec.ExitError
		if !errors.As(err, &ee) || ee.ExitCode() != 2 {
			t.Errorf("%v %v: want exit 2, got %v\n%s", tc.args, tc.env, err, out)
			continue
		}
		if !strings.Contains(string(out), tc.want) {
			t.Errorf("%v %v: message does not name %s:\n%s", tc.args, tc.env, tc.want, out)
		}
	}
}

func TestAuthToken(t *testing.T) {
	const token = "tok-9f8e7d6c5b4a"
	file := filepath.Join(t.TempDir(), "token")
	if err := os.WriteFile(file, []byte(token+"\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--auth-token-file", file)
	for _, h := range []http.Header{nil, {"Authorization": {"Bearer nope"}}} {
		_, err := dialErr(s.url(), h)
		var de *dialError
		if !errors.As(err, &de) || de.status != http.StatusUnauthorized {
			t.Fatalf("header %v: want 401, got %v", h, err)
		}
	}
	c, err := dialErr(s.url(), http.Header{"Authorization": {"Bearer " + token}})
	if err != nil {
		t.Fatalf("right token: %v", err)
	}
	c.t = t
	c.initialize()
	c.close()
	s.stop(t)
	if strings.Contains(s.logs.String(), token) {
		t.Fatal("the token reached the log")
	}
}

func TestConnectionLimit(t *testing.T) {
	s := startServer(t, "--max-connections", "2")
	a, b := dial(t, s), dial(t, s)
	a.initialize()
	b.initialize()
	_, err := dialErr(s.url(), nil)
	var de *dialError
	if !errors.As(err, &de) || de.status != http.StatusServiceUnavailable || de.header.Get("Retry-After") == "" {
		t.Fatalf("third connection: %v", err)
	}
	a.close()
	s.waitCounts(t, 2*time.Second, "one connection left", func(sn snapshot) bool { return sn.Connections == 1 })
	c := dial(t, s)
	c.initialize()
}

// TestSessionFlood: a flood of session/new hits the per-connection limit
// with a clear error; the server stays healthy.
func TestSessionFlood(t *testing.T) {
	s := startServer(t, "--max-sessions-per-connection", "20")
	c := dial(t, s)
	c.initialize()
	for range 200 {
		c.send("session/new", map[string]any{"cwd": "/tmp/f", "mcpServers": []any{}})
	}
	ok, refused := 0, 0
	for range 200 { // answers come in any order: requests run concurrently
		resp, err := c.read(10 * time.Second)
		switch {
		case err != nil:
			t.Fatalf("after %d answers: %v", ok+refused, err)
		case resp.Error == nil:
			ok++
		case resp.Error.Code == acp.CodeRetryLater && strings.Contains(resp.Error.Message, "limit"):
			refused++
		default:
			t.Fatalf("unexpected answer %+v", resp.Error)
		}
	}
	if ok != 20 || refused != 180 {
		t.Fatalf("%d created, %d refused; want 20 and 180", ok, refused)
	}
	other := dial(t, s)
	other.initialize()
	sid := other.newSession("/tmp/o")
	if stop, _ := other.prompt(sid, "fine"); stop != acp.StopEndTurn {
		t.Fatalf("other client: %s", stop)
	}
	c.close()
	other.close()
	s.waitIdle(t, 5*time.Second)
}

// TestOddMessages: a notification carrying an id is answered like a
// request, responses to ids nobody asked are dropped, huge ids are echoed
// verbatim and deep nesting is refused; the connection stays usable.
func TestOddMessages(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	c.initialize()
	sid := c.newSession("/tmp/p")

	c.sendText(`{"jsonrpc":"2.0","id":"n1","method":"session/cancel","params":{"sessionId":"` + sid + `"}}`)
	if m, err := c.read(5 * time.Second); err != nil || string(m.ID) != `"n1"` || m.Error != nil {
		t.Fatalf("cancel with an id: %+v %v", m, err)
	}
	c.sendText(`{"jsonrpc":"2.0","id":424242,"result":{"outcome":"x"}}`)
	c.sendText(`{"jsonrpc":"2.0","id":424243,"error":{"code":1,"message":"x"}}`)
	c.sendText(`{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"session/list","params":{}}`)
	if m, err := c.read(5 * time.Second); err != nil || string(m.ID) != "123456789012345678901234567890" {
		t.Fatalf("huge id: %+v %v", m, err)
	}
	c.sendText(`{"jsonrpc":"2.0","id":5,"method":"session/list","params":{"cwd":` + strings.Repeat("[", 5000) + strings.Repeat("]", 5000) + `}}`)
	if m, err := c.read(5 * time.Second); err != nil || m.Error == nil || m.Error.Code != acp.CodeInvalidRequest {
		t.Fatalf("deep nesting: %+v %v", m, err)
	}
	c.sendText(`{"jsonrpc":"2.0","id":6,"method":"session/prompt","params":{"sessionId":["not","a","string"],"prompt":[]}}`)
	if m, err := c.read(5 * time.Second); err != nil || m.Error == nil || m.Error.Code != acp.CodeInvalidParams {
		t.Fatalf("wrong type: %+v %v", m, err)
	}
	if stop, upd := c.prompt(sid, "ok"); stop != acp.StopEndTurn || agentText(upd) != "ok" {
		t.Fatalf("after odd messages: %s %q", stop, agentText(upd))
	}
}

// TestHandshakeNeverCompletes: an upgraded connection that never sends
// initialize is closed with 1008 after the handshake timeout.
func TestHandshakeNeverCompletes(t *testing.T) {
	s := startServer(t, "--handshake-timeout", "300ms")
	c := dial(t, s)
	if code, _ := c.expectClose(10 * time.Second); code != websocket.StatusPolicyViolation {
		t.Fatalf("close code %d, want 1008", code)
	}
	s.waitIdle(t, 2*time.Second)
}

// TestClientThatNeverReads: its writes block, the write deadline drops it
// and ends its sessions, and another client is served meanwhile.
func TestClientThatNeverReads(t *testing.T) {
	s := startServer(t, "--write-timeout", "1s")
	stuck := dial(t, s)
	stuck.initialize()
	var sids []string
	for range 10 {
		sids = append(sids, stuck.newSession("/tmp/stuck"))
	}
	big := strings.Repeat("x", 1<<20)
	for i := range 30 {
		// The server may drop us before we are done sending: that is the
		// behaviour under test, so a failed write just ends the flood.
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		err := stuck.ws.Write(ctx, websocket.MessageText, mustJSON(t, map[string]any{
			"jsonrpc": "2.0", "id": 1000 + i, "method": "session/prompt", "params": textPrompt(sids[i%len(sids)], big)}))
		cancel()
		if err != nil {
			break
		}
	}
	// Never read from stuck again.
	other := dial(t, s)
	other.initialize()
	sid := other.newSession("/tmp/other")
	for i := range 5 {
		start := time.Now()
		if stop, upd := other.prompt(sid, fmt.Sprint("ping ", i)); stop != acp.StopEndTurn || agentText(upd) != fmt.Sprint("ping ", i) {
			t.Fatalf("other client: %s %q", stop, agentText(upd))
		}
		if d := time.Since(start); d > 2*time.Second {
			t.Fatalf("other client slowed to %v by a client that never reads", d)
		}
	}
	sn := s.waitCounts(t, 15*time.Second, "stuck client dropped", func(sn snapshot) bool {
		return sn.Connections == 1 && sn.Sessions == 1 && sn.Ended["disconnected"] == 10
	})
	if sn.InflightPrompts != 0 {
		t.Fatalf("after drop: %+v", sn)
	}
	other.close()
	s.waitIdle(t, 5*time.Second)
}

// TestShutdownUnderStress: a black-holed upstream, a client that never
// reads and a running prompt; SIGTERM still exits 0 within the deadline
// and every runtime counts as shutdown.
func TestShutdownUnderStress(t *testing.T) {
	hole := blackholeListener(t)
	s := startServer(t, "--shutdown-timeout", "5s", "--mcp-close-timeout", "1s", "--mcp-start-timeout", "1s", "--write-timeout", "2s")

	busy := dial(t, s)
	busy.initialize()
	sid := busy.newSession("/tmp/busy", httpServerEntry("hole", hole))
	busy.startHeldPrompt(sid)

	stuck := dial(t, s)
	stuck.initialize()
	ssid := stuck.newSession("/tmp/stuck")
	stuck.send("session/prompt", textPrompt(ssid, strings.Repeat("y", 1<<20)))

	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for s.snapshot(t).Sessions != 2 && ctx.Err() == nil {
		time.Sleep(10 * time.Millisecond)
	}
	elapsed, code := s.stop(t)
	if code != 0 || elapsed > 6*time.Second {
		t.Fatalf("exit %d after %v, deadline 5s", code, elapsed)
	}
	if n := countReason(s.logs.String(), "shutdown") + countReason(s.logs.String(), "disconnected"); n != 2 {
		t.Fatalf("%d runtimes ended, want 2\n%s", n, s.logs.String())
	}
}

func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return b
}
