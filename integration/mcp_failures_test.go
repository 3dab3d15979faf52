package integration

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A black-holed upstream (accepts, never answers) fails the server's start
// within the start bound, and one that stops answering later cannot hold
// EndSession or shutdown past their bounds.
func TestMCPBlackholedUpstream(t *testing.T) {
	hole := blackholeListener(t)
	s := startServer(t, "--mcp-start-timeout", "1s", "--mcp-close-timeout", "1s")
	c := dial(t, s)
	c.initialize()
	start := time.Now()
	var r struct{ SessionID string }
	c.mustCall("session/new", map[string]any{"cwd": "/tmp", "mcpServers": []any{httpServerEntry("hole", hole)}}, &r)
	before := c.followUps(r.SessionID, 1)
	if took := time.Since(start); took > 5*time.Second {
		t.Fatalf("session/new took %s with a 1s start bound", took)
	}
	if txt := agentText(before); !strings.Contains(txt, `"hole"`) || !strings.Contains(txt, "no answer within 1s") {
		t.Fatalf("failure report: %q", txt)
	}
	if sn := s.snapshot(t); sn.MCPClients != 0 || sn.Sessions != 1 {
		t.Fatalf("after a failed start: %+v", sn)
	}

	// An upstream that answered at first, then black-holes: the close
	// (its DELETE) is bounded.
	up := startUpstream(t, "A")
	sid := c.newSession("/tmp", httpServerEntry("up", up.url()))
	if st, _ := c.callTool(sid, "up/whoami", "{}"); st != "completed" {
		t.Fatalf("call: %s", st)
	}
	up.blackhole()
	start = time.Now()
	c.mustCall("session/close", map[string]any{"sessionId": sid}, nil)
	if took := time.Since(start); took > 4*time.Second {
		t.Fatalf("session/close took %s with a 1s close bound", took)
	}
	// The log reaches us through a pipe: poll for the warning.
	for deadline := time.Now().Add(5 * time.Second); !strings.Contains(s.logs.String(), "MCP client close failed"); {
		if time.Now().After(deadline) {
			t.Fatalf("no warning for the failed close:\n%s", s.logs.String())
		}
		time.Sleep(10 * time.Millisecond)
	}

	// Shutdown with one black-holed upstream per live session.
	sid2 := c.newSession("/tmp")
	_ = sid2
	up2 := startUpstream(t, "B")
	sid3 := c.newSession("/tmp", httpServerEntry("up", up2.url()))
	if st, _ := c.callTool(sid3, "up/whoami", "{}"); st != "completed" {
		t.Fatalf("call: %s", st)
	}
	up2.blackhole()
	if elapsed, code := s.stop(t); code != 0 || elapsed > 8*time.Second {
		t.Fatalf("shutdown took %s (exit %d)", elapsed, code)
	}
}

// Servers that cannot start do not fail the session: the client is told
// which and why, the log says it, nothing is left running, and no secret
// reaches the log.
func TestMCPStartFailures(t *testing.T) {
	up := startUpstream(t, "A")
	hole := blackholeListener(t)
	s := startServer(t, "--mcp-start-timeout", "2s")
	c := dial(t, s)
	c.initialize()
	marker := randHex()
	secret := "sekrit-" + randHex()
	var r struct{ SessionID string }
	c.mustCall("session/new", map[string]any{"cwd": "/tmp", "mcpServers": []any{
		stdioServer(t, "crashes", marker, "STDIOMCP_FAIL", "boom: bad config", "API_KEY", secret),
		map[string]any{"name": "missing", "command": "/nonexistent/mcp-server", "args": []string{}, "env": []any{}},
		httpServerEntry("refused", "http://127.0.0.1:1/mcp?token="+secret, "Authorization", "Bearer "+secret),
		httpServerEntry("hole", hole+"?key="+secret, "X-Api-Key", secret),
		httpServerEntry("up", up.url(), "Authorization", "Bearer "+secret),
	}}, &r)
	before := c.followUps(r.SessionID, 4)
	txt := agentText(before)
	for _, want := range []string{`"crashes"`, "failing on purpose", `"missing"`, `"refused"`, `"hole"`} {
		if !strings.Contains(txt, want) {
			t.Errorf("failure report lacks %q: %q", want, txt)
		}
	}
	if strings.Contains(txt, `"up"`) {
		t.Errorf("the working server was reported as failed: %q", txt)
	}
	if sn := s.snapshot(t); sn.MCPClients != 1 {
		t.Fatalf("want only the working client: %+v", sn)
	}
	_, tools := c.prompt(r.SessionID, "/tools")
	if lst := agentText(tools); !strings.Contains(lst, "up/whoami") || strings.Contains(lst, "crashes/") {
		t.Fatalf("/tools: %q", lst)
	}
	if st, text := c.callTool(r.SessionID, "crashes/echo", "{}"); st != "failed" {
		t.Fatalf("call to a failed server: %s %q", st, text)
	}
	waitNoProcs(t, marker, 5*time.Second)
	if n := s.logs.count("MCP server failed to start"); n != 4 {
		t.Errorf("%d failure log lines, want 4", n)
	}
	c.close()
	s.waitIdle(t, 10*time.Second)
	up.waitBalanced(t, 5*time.Second)
	s.stop(t)
	if strings.Contains(s.logs.String(), secret) {
		t.Fatalf("a secret reached the log:\n%s", s.logs.String())
	}
	if strings.Contains(txt, secret) {
		t.Fatalf("a secret reached the client: %q", txt)
	}
}

// A stdio server runs a command on this host: refused beyond loopback
// unless --allow-stdio-mcp, and then only commands on the allow-list.
func TestMCPStdioPolicy(t *testing.T) {
	cases := []struct {
		name    string
		args    []string
		refused string // "" means allowed
	}{
		{"loopback", nil, ""},
		{"beyond loopback", []string{"--listen", "0.0.0.0:0"}, "--allow-stdio-mcp"},
		{"allowed", []string{"--listen", "0.0.0.0:0", "--allow-stdio-mcp"}, ""},
		{"not on the allow-list", []string{"--stdio-mcp-allow", "npx,uvx"}, "allow-list"},
		{"on the allow-list", []string{"--stdio-mcp-allow", "npx,stdiomcp"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			s := startServer(t, tc.args...)
			c := dial(t, s)
			c.initialize()
			marker := randHex()
			var r struct{ SessionID string }
			c.mustCall("session/new", map[string]any{"cwd": "/tmp", "mcpServers": []any{stdioServer(t, "local", marker)}}, &r)
			wantReports := 0
			if tc.refused != "" {
				wantReports = 1
			}
			before := c.followUps(r.SessionID, wantReports)
			txt := agentText(before)
			if tc.refused == "" {
				if txt != "" {
					t.Fatalf("refused: %q", txt)
				}
				if st, _ := c.callTool(r.SessionID, "local/whoami", "{}"); st != "completed" {
					t.Fatalf("call: %s", st)
				}
			} else {
				if !strings.Contains(txt, tc.refused) {
					t.Fatalf("refusal %q lacks %q", txt, tc.refused)
				}
				if live, _ := markedProcs(marker); len(live) != 0 {
					t.Fatalf("a refused server runs: %v", live)
				}
			}
			c.close()
			s.waitIdle(t, 10*time.Second)
			waitNoProcs(t, marker, 5*time.Second)
		})
	}
}

// The upstream forgets our session (HTTP 404): the call re-initializes once
// and succeeds; an upstream that keeps forgetting gives a failed call.
func TestMCPUpstreamSessionLost(t *testing.T) {
	up := startUpstream(t, "A")
	s := startServer(t)
	c := dial(t, s)
	c.initialize()
	sid := c.newSession("/tmp", httpServerEntry("up", up.url()))
	up.mu.Lock()
	for id := range up.live {
		delete(up.live, id)
		up.forgot[id] = true
	}
	up.mu.Unlock()
	if st, text := c.callTool(sid, "up/whoami", "{}"); st != "completed" || text != "http:A" {
		t.Fatalf("after the upstream forgot us: %s %q", st, text)
	}
	if got := up.counts(); got.inits != 2 || got.live != 1 {
		t.Fatalf("want one re-initialize: %+v", got)
	}
	up.mu.Lock()
	up.forget = true
	up.mu.Unlock()
	if st, text := c.callTool(sid, "up/whoami", "{}"); st != "failed" {
		t.Fatalf("an upstream that keeps forgetting: %s %q", st, text)
	}
	up.mu.Lock()
	up.forget = false
	up.mu.Unlock()
	c.close()
	s.waitIdle(t, 10*time.Second)
	up.waitBalanced(t, 5*time.Second)
}

// Global servers from --config: one client each for the process, their
// tools in every session, refreshed on tools/list_changed, closed (with
// DELETE) at shutdown.
func TestMCPGlobalServers(t *testing.T) {
	up := startUpstream(t, "G")
	cfg := filepath.Join(t.TempDir(), "config.json")
	if err := os.WriteFile(cfg, []byte(`{"mcpServers": {"glob": {"type": "http", "url": "`+up.url()+`"}}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	s := startServer(t, "--config", cfg)
	for range 3 {
		c := dial(t, s)
		c.initialize()
		sid := c.newSession("/tmp")
		if _, ups := c.prompt(sid, "/tools"); !strings.Contains(agentText(ups), "glob/whoami") {
			t.Fatalf("/tools: %q", agentText(ups))
		}
		if st, text := c.callTool(sid, "glob/whoami", "{}"); st != "completed" || text != "http:G" {
			t.Fatalf("global call: %s %q", st, text)
		}
		c.close()
	}
	s.waitIdle(t, 10*time.Second)
	if got := up.counts(); got.inits != 1 || got.live != 1 {
		t.Fatalf("want one process-wide upstream session: %+v", got)
	}
	// A new tool upstream reaches new sessions' toolsets.
	addTool(up, "added")
	c := dial(t, s)
	c.initialize()
	sid := c.newSession("/tmp")
	waitForTool(t, c, sid, "glob/added")
	c.close()
	s.stop(t)
	up.waitBalanced(t, 5*time.Second)
}

// A session's own server that adds a tool (tools/list_changed) refreshes
// that session's toolset while the session runs.
func TestMCPSessionToolsetRefresh(t *testing.T) {
	up := startUpstream(t, "R")
	s := startServer(t)
	c := dial(t, s)
	c.initialize()
	sid := c.newSession("/tmp", httpServerEntry("mine", up.url()))
	if _, ups := c.prompt(sid, "/tools"); strings.Contains(agentText(ups), "mine/late") {
		t.Fatalf("tool listed before it exists: %q", agentText(ups))
	}
	addTool(up, "late")
	waitForTool(t, c, sid, "mine/late")
	c.close()
	s.waitIdle(t, 5*time.Second)
	up.waitBalanced(t, 5*time.Second)
}

// waitForTool polls /tools until the session lists tool (a refresh after
// tools/list_changed), failing after 10s.
func waitForTool(t *testing.T, c *client, sid, tool string) {
	t.Helper()
	for deadline := time.Now().Add(10 * time.Second); ; {
		_, ups := c.prompt(sid, "/tools")
		if strings.Contains(agentText(ups), tool) {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("tools/list_changed did not bring %s into the toolset: %q", tool, agentText(ups))
		}
		time.Sleep(50 * time.Millisecond)
	}
}
