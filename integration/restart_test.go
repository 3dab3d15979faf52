package integration

import (
	"fmt"
	"testing"
	"time"

	"github.com/acpserver/acpserver/acp"
)

// TestRestartKeepsSessions: with --data-dir, records and history survive a
// restart; session/load on the new process replays the history in order.
func TestRestartKeepsSessions(t *testing.T) {
	dir := t.TempDir()
	s1 := startServer(t, "--data-dir", dir)
	c := dial(t, s1)
	c.initialize()
	sid := c.newSession("/tmp/persist")
	c.prompt(sid, "before the restart")
	c.close()
	s1.stop(t)

	s2 := startServer(t, "--data-dir", dir)
	c2 := dial(t, s2)
	c2.initialize()
	var list acp.ListSessionsResponse
	c2.mustCall("session/list", map[string]any{}, &list)
	if len(list.Sessions) != 1 || list.Sessions[0].SessionID != sid || list.Sessions[0].Title == nil {
		t.Fatalf("list after restart: %+v", list)
	}
	before := c2.mustCall("session/load", map[string]any{"sessionId": sid, "cwd": "/tmp/persist", "mcpServers": []any{}}, nil)
	var kinds []string
	for _, m := range before {
		_, kind, _ := m.update()
		kinds = append(kinds, kind)
	}
	if fmt.Sprint(kinds) != "[user_message_chunk agent_message_chunk]" || agentText(before) != "before the restart" {
		t.Fatalf("replay after restart: %v %q", kinds, agentText(before))
	}
	if stop, upd := c2.prompt(sid, "after"); stop != acp.StopEndTurn || agentText(upd) != "after" {
		t.Fatalf("prompt after restart: %s %q", stop, agentText(upd))
	}
	c2.mustCall("session/delete", map[string]any{"sessionId": sid}, nil)
	c2.close()
	s2.waitIdle(t, 5*time.Second)
}

// TestBridgeSurvivesServerRestart: the server behind a real bridge process
// restarts (same address, same data dir); the IDE keeps its session id and
// its next prompt works.
func TestBridgeSurvivesServerRestart(t *testing.T) {
	dir := t.TempDir()
	s1 := startServer(t, "--data-dir", dir)
	addr := s1.addr
	b := startLineProc(t, "bridge", "--log-format", "json", "--max-backoff", "200ms", "--outage-wait", "20s", "ws://"+addr+"/acp")
	b.mustCall("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}}, nil)
	var ns struct{ SessionID string }
	b.mustCall("session/new", map[string]any{"cwd": "/tmp/project", "mcpServers": []any{}}, &ns)
	var pr struct{ StopReason string }
	b.mustCall("session/prompt", textPrompt(ns.SessionID, "one"), &pr)

	s1.stop(t)
	s2 := startServer(t, "--data-dir", dir, "--listen", addr)
	before := b.mustCall("session/prompt", textPrompt(ns.SessionID, "two"), &pr)
	if agentText(before) != "two" || pr.StopReason != "end_turn" {
		t.Fatalf("prompt after the restart: %+v %q", pr, agentText(before))
	}
	s2.waitCounts(t, 5*time.Second, "the resumed runtime on the new server", func(sn snapshot) bool {
		return sn.Connections == 1 && sn.Sessions == 1
	})
}
