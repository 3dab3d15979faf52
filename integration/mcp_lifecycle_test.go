package integration

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// endWays ends the runtime of sid (attached to c on s) one way each; they
// return the reason counted in /debug/sessions.
var endWays = []struct {
	name   string
	reason string
	end    func(t *testing.T, s *server, c *client, sid string)
}{
	{"close", "closed", func(t *testing.T, s *server, c *client, sid string) {
		c.mustCall("session/close", map[string]any{"sessionId": sid}, nil)
	}},
	{"disconnect", "disconnected", func(t *testing.T, s *server, c *client, sid string) {
		c.kill()
	}},
	{"superseded", "superseded", func(t *testing.T, s *server, c *client, sid string) {
		c2 := dial(t, s)
		c2.initialize()
		c2.mustCall("session/resume", map[string]any{"sessionId": sid, "cwd": "/tmp", "mcpServers": []any{}}, nil)
		c2.close()
	}},
	{"delete", "deleted", func(t *testing.T, s *server, c *client, sid string) {
		c.mustCall("session/delete", map[string]any{"sessionId": sid}, nil)
	}},
}

func TestMCPHTTPUpstreamEndsWithEveryRuntime(t *testing.T) {
	up := startUpstream(t, "A")
	s := startServer(t)
	for _, way := range endWays {
		t.Run(way.name, func(t *testing.T) {
			c := dial(t, s)
			c.initialize()
			sid := c.newSession("/tmp", httpServerEntry("up", up.url()))
			if sn := s.snapshot(t); sn.MCPClients != 1 || sn.Toolsets != 1 {
				t.Fatalf("after session/new: %+v", sn)
			}
			if st, text := c.callTool(sid, "up/whoami", "{}"); st != "completed" || text != "http:A" {
				t.Fatalf("call: %s %q", st, text)
			}
			if c := up.counts(); c.live != 1 {
				t.Fatalf("upstream while the session runs: %+v", c)
			}
			before := s.snapshot(t).Ended[way.reason]
			way.end(t, s, c, sid)
			s.waitCounts(t, 10*time.Second, "runtime ended as "+way.reason, func(sn snapshot) bool { return sn.Ended[way.reason] == before+1 })
			c.close()
			s.waitIdle(t, 10*time.Second)
			up.waitBalanced(t, 5*time.Second)
		})
	}
	t.Run("shutdown", func(t *testing.T) {
		s := startServer(t)
		c := dial(t, s)
		c.initialize()
		sid := c.newSession("/tmp", httpServerEntry("up", up.url()))
		if st, _ := c.callTool(sid, "up/whoami", "{}"); st != "completed" {
			t.Fatalf("call: %s", st)
		}
		if elapsed, code := s.stop(t); code != 0 || elapsed > 10*time.Second {
			t.Fatalf("shutdown took %s, exit %d", elapsed, code)
		}
		up.waitBalanced(t, 5*time.Second)
	})
	if c := up.counts(); c.inits != len(endWays)+1 || c.deletes != c.inits {
		t.Fatalf("upstream counts %+v", c)
	}
}

func TestMCPStdioProcessTreeEndsWithEveryRuntime(t *testing.T) {
	s := startServer(t)
	check := func(t *testing.T, c *client, sid string) (pid, child int) {
		t.Helper()
		st, text := c.callTool(sid, "local/pids", "{}")
		if st != "completed" {
			t.Fatalf("pids: %s %q", st, text)
		}
		var p struct{ Pid, Child int }
		if err := json.Unmarshal([]byte(text), &p); err != nil || p.Pid == 0 || p.Child == 0 {
			t.Fatalf("pids %q: %v", text, err)
		}
		return p.Pid, p.Child
	}
	for _, way := range endWays {
		t.Run(way.name, func(t *testing.T) {
			marker := randHex()
			c := dial(t, s)
			c.initialize()
			sid := c.newSession("/tmp", stdioServer(t, "local", marker))
			pid, child := check(t, c, sid)
			if live, _ := markedProcs(marker); len(live) != 2 {
				t.Fatalf("want the server and its child alive, got %v (pid %d child %d)", live, pid, child)
			}
			way.end(t, s, c, sid)
			c.close()
			s.waitIdle(t, 10*time.Second)
			waitNoProcs(t, marker, 5*time.Second)
			if z := zombieChildren(s.cmd.Process.Pid); len(z) > 0 {
				t.Fatalf("zombie children of acpserver: %v", z)
			}
		})
	}
	t.Run("sigkill", func(t *testing.T) {
		// A server that ignores SIGTERM and lingers after stdin closes is
		// ended by SIGKILL of its group, within the close bound.
		s := startServer(t, "--mcp-close-timeout", "1s")
		marker := randHex()
		c := dial(t, s)
		c.initialize()
		sid := c.newSession("/tmp", stdioServer(t, "local", marker, "STDIOMCP_IGNORE_TERM", "1"))
		check(t, c, sid)
		start := time.Now()
		c.mustCall("session/close", map[string]any{"sessionId": sid}, nil)
		if took := time.Since(start); took > 3*time.Second {
			t.Fatalf("session/close took %s with a 1s close bound", took)
		}
		waitNoProcs(t, marker, 5*time.Second)
		c.close()
		s.waitIdle(t, 5*time.Second)
	})
	t.Run("shutdown", func(t *testing.T) {
		s := startServer(t)
		marker := randHex()
		c := dial(t, s)
		c.initialize()
		sid := c.newSession("/tmp", stdioServer(t, "local", marker))
		check(t, c, sid)
		if _, code := s.stop(t); code != 0 {
			t.Fatalf("exit %d", code)
		}
		waitNoProcs(t, marker, 5*time.Second)
	})
}

func TestMCPResumeGetsFreshUpstream(t *testing.T) {
	a := startUpstream(t, "A")
	b := startUpstream(t, "B")
	s := startServer(t)
	c := dial(t, s)
	c.initialize()
	sid := c.newSession("/tmp", httpServerEntry("up", a.url()))
	if st, text := c.callTool(sid, "up/whoami", "{}"); text != "http:A" {
		t.Fatalf("before: %s %q", st, text)
	}
	c.kill()
	s.waitIdle(t, 10*time.Second)

	c2 := dial(t, s)
	c2.initialize()
	c2.mustCall("session/resume", map[string]any{"sessionId": sid, "cwd": "/tmp", "mcpServers": []any{httpServerEntry("up", b.url())}}, nil)
	callsA := a.counts()
	for range 3 {
		if st, text := c2.callTool(sid, "up/whoami", "{}"); st != "completed" || text != "http:B" {
			t.Fatalf("after resume: %s %q; want B", st, text)
		}
	}
	if got := a.counts(); got != callsA {
		t.Fatalf("A was used after the resume: %+v -> %+v", callsA, got)
	}
	if ac := a.waitBalanced(t, 5*time.Second); ac.inits != 1 || ac.deletes != 1 {
		t.Fatalf("A: %+v", ac)
	}
	c2.close()
	s.waitIdle(t, 10*time.Second)
	b.waitBalanced(t, 5*time.Second)
}

func TestMCPInflightCallCancelledAndJoined(t *testing.T) {
	up := startUpstream(t, "A")
	s := startServer(t)
	marker := randHex()

	t.Run("disconnect", func(t *testing.T) {
		for _, tool := range []string{"up/sleep", "local/sleep"} {
			c := dial(t, s)
			c.initialize()
			sid := c.newSession("/tmp", httpServerEntry("up", up.url()), stdioServer(t, "local", marker))
			c.send("session/prompt", textPrompt(sid, "/call "+tool+` {"ms":60000}`))
			s.waitCounts(t, 10*time.Second, "one tool call in flight", func(sn snapshot) bool { return sn.InflightToolCalls == 1 })
			c.kill()
			s.waitIdle(t, 10*time.Second)
			up.waitBalanced(t, 5*time.Second)
			waitNoProcs(t, marker, 5*time.Second)
		}
	})
	t.Run("session/cancel", func(t *testing.T) {
		c := dial(t, s)
		c.initialize()
		sid := c.newSession("/tmp", httpServerEntry("up", up.url()))
		id := c.send("session/prompt", textPrompt(sid, `/call up/sleep {"ms":60000}`))
		s.waitCounts(t, 10*time.Second, "one tool call in flight", func(sn snapshot) bool { return sn.InflightToolCalls == 1 })
		c.notify("session/cancel", map[string]any{"sessionId": sid})
		resp, updates := c.await(id)
		if resp.Error != nil || !strings.Contains(string(resp.Result), "cancelled") {
			t.Fatalf("cancelled prompt answered %s %v", resp.Result, resp.Error)
		}
		if st, _ := toolOutcome(updates); st != "failed" {
			t.Fatalf("cancelled tool call status %q", st)
		}
		s.waitCounts(t, 5*time.Second, "no tool call in flight", func(sn snapshot) bool { return sn.InflightToolCalls == 0 })
		// The session still works after the cancel.
		if st, text := c.callTool(sid, "up/whoami", "{}"); st != "completed" || text != "http:A" {
			t.Fatalf("after cancel: %s %q", st, text)
		}
		c.close()
		s.waitIdle(t, 10*time.Second)
		up.waitBalanced(t, 5*time.Second)
	})
}

// The idle TTL ends a runtime like any other way: DELETE upstream, the
// stdio tree gone.
func TestMCPIdleRuntimeReleasesClients(t *testing.T) {
	up := startUpstream(t, "A")
	s := startServer(t, "--session-idle-ttl", "1s")
	marker := randHex()
	c := dial(t, s)
	c.initialize()
	sid := c.newSession("/tmp", httpServerEntry("up", up.url()), stdioServer(t, "local", marker))
	if st, _ := c.callTool(sid, "up/whoami", "{}"); st != "completed" {
		t.Fatalf("call: %s", st)
	}
	s.waitCounts(t, 20*time.Second, "runtime ended idle", func(sn snapshot) bool {
		return sn.Ended["idle"] == 1 && sn.Sessions == 0 && sn.MCPClients == 0 && sn.Toolsets == 0
	})
	up.waitBalanced(t, 5*time.Second)
	waitNoProcs(t, marker, 5*time.Second)
	c.close()
	s.waitIdle(t, 10*time.Second)
}
