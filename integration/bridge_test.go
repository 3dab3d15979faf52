package integration

import (
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/acpserver/acpserver/internal/cutproxy"
)

// sockets counts the open sockets of a process (Linux /proc).
func sockets(t testing.TB, pid int) int {
	t.Helper()
	dir := filepath.Join("/proc", strconv.Itoa(pid), "fd")
	ents, err := os.ReadDir(dir)
	if err != nil {
		t.Skipf("cannot count sockets: %v", err)
	}
	n := 0
	for _, e := range ents {
		if l, err := os.Readlink(filepath.Join(dir, e.Name())); err == nil && strings.HasPrefix(l, "socket:") {
			n++
		}
	}
	return n
}

func waitUntil(t testing.TB, within time.Duration, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(within)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("after %v: %s never held", within, what)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// TestBridgeLinkLoss drives a real bridge process as an IDE would, with a
// real server behind a proxy that cuts the TCP connection mid-session.
func TestBridgeLinkLoss(t *testing.T) {
	s := startServer(t)
	px := cutproxy.Start(t, s.addr)
	b := startLineProc(t, "bridge", "--log-format", "json", "--log-level", "debug", "--max-backoff", "200ms", "--outage-wait", "20s", "ws://"+px.Addr()+"/acp")

	var init struct {
		ProtocolVersion int `json:"protocolVersion"`
	}
	b.mustCall("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}}, &init)
	var ns struct{ SessionID string }
	b.mustCall("session/new", map[string]any{"cwd": "/tmp/project", "mcpServers": []any{}}, &ns)
	sid := ns.SessionID
	var pr struct{ StopReason string }
	if before := b.mustCall("session/prompt", textPrompt(sid, "through the bridge"), &pr); agentText(before) != "through the bridge" {
		t.Fatalf("echo %q", agentText(before))
	}
	baseSockets := sockets(t, b.cmd.Process.Pid)

	for round := 1; round <= 3; round++ {
		// A prompt is running when the link is cut: it gets an error.
		id := b.send("session/prompt", textPrompt(sid, "/sleep 60s"))
		if m := b.read(); m.Method != "session/update" {
			t.Fatalf("round %d: want the turn's first update, got %+v", round, m)
		}
		px.Cut()
		resp, _ := b.await(id)
		if resp.Error == nil || !strings.Contains(resp.Error.Message, "connection to the agent server was lost") {
			t.Fatalf("round %d: prompt in flight at the cut: %+v", round, resp)
		}
		// Same session id, working prompt afterwards (held until the
		// bridge has reconnected and resumed); no second initialize result.
		before := b.mustCall("session/prompt", textPrompt(sid, "still here"), &pr)
		if agentText(before) != "still here" || pr.StopReason != "end_turn" {
			t.Fatalf("round %d: prompt after the cut: %+v %q", round, pr, agentText(before))
		}
		for _, m := range before {
			if m.Method != "session/update" {
				t.Fatalf("round %d: unexpected message to the IDE: %+v", round, m)
			}
		}
		if px.Accepts() != round+1 {
			t.Fatalf("round %d: %d connections made", round, px.Accepts())
		}
		// The server never runs the session on the dead connection: one
		// connection, one runtime.
		s.waitCounts(t, 10*time.Second, "one connection, one runtime", func(sn snapshot) bool {
			return sn.Connections == 1 && sn.Sessions == 1 && sn.InflightPrompts == 0
		})
	}
	// No socket leak in the bridge across reconnects.
	waitUntil(t, 10*time.Second, "bridge sockets back to their count before the cuts", func() bool {
		return sockets(t, b.cmd.Process.Pid) <= baseSockets
	})

	// stdin EOF: normal close, exit 0, and the server ends the runtime.
	if code := b.closeStdin(); code != 0 {
		t.Fatalf("bridge exit code %d\n%s", code, b.stderr.String())
	}
	s.waitIdle(t, 10*time.Second)
	if !strings.Contains(s.logs.String(), `"cause":"peer close 1000"`) {
		t.Fatalf("server did not see a normal close (1000) from the bridge:\n%s", s.logs.String())
	}
}
