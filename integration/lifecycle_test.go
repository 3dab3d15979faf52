package integration

import (
	"net/http"
	"testing"
	"time"

	"github.com/acpserver/acpserver/acp"
)

func TestLifecycle(t *testing.T) {
	s := startServer(t)
	c := dial(t, s)
	if c.connID == "" {
		t.Fatal("no Acp-Connection-Id header on the 101 response")
	}

	init := c.initialize()
	if init.ProtocolVersion != 1 || !init.AgentCapabilities.LoadSession {
		t.Fatalf("initialize: %+v", init)
	}
	sc := init.AgentCapabilities.SessionCapabilities
	if sc.Resume == nil || sc.Close == nil || sc.List == nil || sc.Delete == nil {
		t.Fatalf("session capabilities not advertised: %+v", sc)
	}

	sid := c.newSession("/tmp/project")
	if sn := s.snapshot(t); sn.Sessions != 1 || sn.Connections != 1 {
		t.Fatalf("after new: %+v", sn)
	}

	// Prompt: the echo arrives as an update before the response.
	stop, updates := c.prompt(sid, "hello there")
	if stop != acp.StopEndTurn {
		t.Fatalf("stopReason %q", stop)
	}
	if got := agentText(updates); got != "hello there" {
		t.Fatalf("echo %q", got)
	}

	// Cancel a running turn: the response says cancelled and comes after
	// the turn's updates.
	id := c.startHeldPrompt(sid)
	if sn := s.snapshot(t); sn.InflightPrompts != 1 {
		t.Fatalf("inflight_prompts %d while a prompt runs", sn.InflightPrompts)
	}
	// A second prompt on the same session is refused, not queued.
	if e, _ := c.call("session/prompt", textPrompt(sid, "again"), nil); e == nil || e.Code != acp.CodeBusy {
		t.Fatalf("second concurrent prompt: want a server error, got %v", e)
	}
	c.notify("session/cancel", map[string]any{"sessionId": sid})
	resp, _ := c.await(id)
	if resp.Error != nil || string(resp.Result) != `{"stopReason":"cancelled"}` {
		t.Fatalf("cancelled prompt answered %s %v", resp.Result, resp.Error)
	}

	// List with and without a cwd filter.
	var list acp.ListSessionsResponse
	c.mustCall("session/list", map[string]any{}, &list)
	if len(list.Sessions) != 1 || list.Sessions[0].SessionID != sid || list.Sessions[0].Title == nil {
		t.Fatalf("list: %+v", list)
	}
	c.mustCall("session/list", map[string]any{"cwd": "/elsewhere"}, &list)
	if len(list.Sessions) != 0 {
		t.Fatalf("cwd filter: %+v", list)
	}

	// Close ends the runtime but keeps the record.
	c.mustCall("session/close", map[string]any{"sessionId": sid}, nil)
	sn := s.waitCounts(t, time.Second, "runtime closed", func(sn snapshot) bool { return sn.Sessions == 0 })
	if sn.Ended["closed"] != 1 {
		t.Fatalf("ended: %+v", sn.Ended)
	}
	if e, _ := c.call("session/prompt", textPrompt(sid, "x"), nil); e == nil || e.Code != acp.CodeNotFound {
		t.Fatalf("prompt after close: want -32002, got %v", e)
	}
	c.mustCall("session/list", map[string]any{}, &list)
	if len(list.Sessions) != 1 {
		t.Fatalf("record gone after close: %+v", list)
	}

	// Delete removes the record too.
	c.mustCall("session/delete", map[string]any{"sessionId": sid}, nil)
	c.mustCall("session/list", map[string]any{}, &list)
	if len(list.Sessions) != 0 {
		t.Fatalf("record kept after delete: %+v", list)
	}
	if e, _ := c.call("session/load", map[string]any{"sessionId": sid, "cwd": "/tmp/project", "mcpServers": []any{}}, nil); e == nil || e.Code != acp.CodeNotFound {
		t.Fatalf("load after delete: want -32002, got %v", e)
	}

	c.close()
	s.waitIdle(t, 2*time.Second)
}

func TestHealthz(t *testing.T) {
	s := startServer(t)
	resp, err := http.Get("http://" + s.addr + "/healthz")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("healthz %d", resp.StatusCode)
	}
}
