package integration

import (
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/acpserver/acpserver/acp"
)

// TestAbruptDisconnect cuts the TCP connection with no close frame while a
// prompt runs: every runtime of the connection ends within 1s.
func TestAbruptDisconnect(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	c.initialize()
	var ids []string
	for range 3 {
		ids = append(ids, c.newSession("/tmp/p"))
	}
	c.startHeldPrompt(ids[0])
	c.kill()
	sn := s.waitIdle(t, time.Second)
	if sn.Ended["disconnected"] != 3 {
		t.Fatalf("ended: %+v", sn.Ended)
	}
}

// TestReconnectLoadAndResume: history replays in order on load; a resume
// on a second connection supersedes the first, which then gets errors.
func TestReconnectLoadAndResume(t *testing.T) {
	s := startServer(t)
	c1 := dial(t, s)
	c1.initialize()
	sid := c1.newSession("/tmp/p")
	for _, text := range []string{"one", "two", "three"} {
		c1.prompt(sid, text)
	}
	c1.kill()
	s.waitCounts(t, time.Second, "runtime ended by disconnect", func(sn snapshot) bool { return sn.Sessions == 0 })

	c2 := dial(t, s)
	c2.initialize()
	before := c2.mustCall("session/load", map[string]any{"sessionId": sid, "cwd": "/tmp/p", "mcpServers": []any{}}, nil)
	var kinds, texts []string
	for _, m := range before {
		id, kind, u := m.update()
		if id != sid {
			t.Fatalf("replayed update for %q", id)
		}
		kinds = append(kinds, kind)
		if content, ok := u["content"].(map[string]any); ok {
			s, _ := content["text"].(string)
			texts = append(texts, s)
		}
	}
	wantKinds := []string{"user_message_chunk", "agent_message_chunk", "user_message_chunk", "agent_message_chunk", "user_message_chunk", "agent_message_chunk"}
	wantTexts := []string{"one", "one", "two", "two", "three", "three"}
	if fmt.Sprint(kinds) != fmt.Sprint(wantKinds) || fmt.Sprint(texts) != fmt.Sprint(wantTexts) {
		t.Fatalf("replay:\n kinds %v\n texts %v", kinds, texts)
	}
	if stop, upd := c2.prompt(sid, "four"); stop != acp.StopEndTurn || agentText(upd) != "four" {
		t.Fatalf("prompt after load: %s %q", stop, agentText(upd))
	}

	// Resume on a third connection supersedes the runtime on c2.
	c3 := dial(t, s)
	c3.initialize()
	if before := c3.mustCall("session/resume", map[string]any{"sessionId": sid, "cwd": "/tmp/p", "mcpServers": []any{}}, nil); len(before) != 0 {
		t.Fatalf("resume replayed %d updates", len(before))
	}
	sn := s.snapshot(t)
	if sn.Ended["superseded"] != 1 || sn.Sessions != 1 {
		t.Fatalf("after resume: %+v", sn)
	}
	if e, _ := c2.call("session/prompt", textPrompt(sid, "stale"), nil); e == nil || e.Code != acp.CodeNotFound {
		t.Fatalf("old connection prompt after supersede: %v", e)
	}
	if stop, upd := c3.prompt(sid, "five"); stop != acp.StopEndTurn || agentText(upd) != "five" {
		t.Fatalf("prompt after resume: %s %q", stop, agentText(upd))
	}
	c2.close()
	c3.close()
	s.waitIdle(t, 2*time.Second)
}

// TestSupersedeRunningPrompt: resuming a session whose prompt runs on
// another connection cancels that prompt first.
func TestSupersedeRunningPrompt(t *testing.T) {
	s := startServer(t)
	c1 := dial(t, s)
	c1.initialize()
	sid := c1.newSession("/tmp/p")
	pid := c1.startHeldPrompt(sid)
	c2 := dial(t, s)
	c2.initialize()
	c2.mustCall("session/resume", map[string]any{"sessionId": sid, "cwd": "/tmp/p", "mcpServers": []any{}}, nil)
	resp, _ := c1.await(pid)
	if resp.Error != nil || string(resp.Result) != `{"stopReason":"cancelled"}` {
		t.Fatalf("superseded prompt answered %s %v", resp.Result, resp.Error)
	}
	if sn := s.snapshot(t); sn.InflightPrompts != 0 || sn.Ended["superseded"] != 1 {
		t.Fatalf("after supersede: %+v", sn)
	}
}

// TestConnectionsAreIsolated: ending one connection leaves the other's
// sessions untouched.
func TestConnectionsAreIsolated(t *testing.T) {
	s := startServer(t)
	a, b := dial(t, s), dial(t, s)
	a.initialize()
	b.initialize()
	sa := a.newSession("/tmp/a")
	sb := b.newSession("/tmp/b")
	if e, _ := b.call("session/prompt", textPrompt(sa, "not mine"), nil); e == nil || e.Code != acp.CodeNotFound {
		t.Fatalf("prompt on another connection's session: %v", e)
	}
	a.kill()
	s.waitCounts(t, time.Second, "a's runtime ended", func(sn snapshot) bool { return sn.Sessions == 1 && sn.Connections == 1 })
	if stop, upd := b.prompt(sb, "still here"); stop != acp.StopEndTurn || agentText(upd) != "still here" {
		t.Fatalf("b after a left: %s %q", stop, agentText(upd))
	}
	b.close()
	s.waitIdle(t, 2*time.Second)
}

// TestHundredSessions creates and ends 100 sessions over several
// connections and ways of ending: every count returns to its baseline.
func TestHundredSessions(t *testing.T) {
	s := startServer(t)
	base := s.snapshot(t)
	const conns, perConn = 4, 25
	var wg sync.WaitGroup
	for i := range conns {
		c := dial(t, s)
		c.initialize()
		wg.Go(func() {
			var ids []string
			for range perConn {
				sid := c.newSession(fmt.Sprintf("/tmp/c%d", i))
				c.prompt(sid, "hi")
				ids = append(ids, sid)
			}
			for j, sid := range ids {
				switch j % 3 {
				case 0:
					c.mustCall("session/close", map[string]any{"sessionId": sid}, nil)
				case 1:
					c.mustCall("session/delete", map[string]any{"sessionId": sid}, nil)
				}
			}
			c.close() // the rest end by disconnect
		})
	}
	wg.Wait()
	sn := s.waitIdle(t, 5*time.Second)
	var ended int64
	for k, v := range sn.Ended {
		ended += v - base.Ended[k]
	}
	if ended != conns*perConn {
		t.Fatalf("%d runtimes ended, want %d: %+v", ended, conns*perConn, sn.Ended)
	}
}

// TestShutdownWithLiveSessions: SIGTERM with live sessions and a running
// prompt exits 0 within the deadline, counting every runtime as shutdown.
func TestShutdownWithLiveSessions(t *testing.T) {
	s := startServer(t, "--shutdown-timeout", "3s")
	c := dial(t, s)
	c.initialize()
	for range 5 {
		c.newSession("/tmp/p")
	}
	sid := c.newSession("/tmp/p")
	c.startHeldPrompt(sid)
	elapsed, code := s.stop(t)
	if code != 0 || elapsed > 3*time.Second+time.Second {
		t.Fatalf("exit %d after %v", code, elapsed)
	}
	logs := s.logs.String()
	if n := s.logs.count("session ended"); n != 6 {
		t.Fatalf("%d session ended lines, want 6\n%s", n, logs)
	}
	if got := countReason(logs, "shutdown"); got != 6 {
		t.Fatalf("%d runtimes ended with reason shutdown, want 6\n%s", got, logs)
	}
	// The client saw its prompt answered and a going-away close.
	code1001, msgs := c.expectClose(5 * time.Second)
	if code1001 != 1001 {
		t.Fatalf("close code %d, want 1001 (messages %v)", code1001, msgs)
	}
}
