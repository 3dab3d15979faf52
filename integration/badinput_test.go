package integration

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/coder/websocket"

	"github.com/acpserver/acpserver/acp"
)

// TestBadInput sends each kind of bad input and checks the documented
// answer; after all of it the server still serves a healthy client.
func TestBadInput(t *testing.T) {
	s := startServer(t, "--read-limit", "65536")

	t.Run("first message not initialize", func(t *testing.T) {
		c := dial(t, s)
		c.send("session/new", map[string]any{"cwd": "/x", "mcpServers": []any{}})
		code, msgs := c.expectClose(5 * time.Second)
		if len(msgs) != 1 || msgs[0].Error == nil || msgs[0].Error.Code != acp.CodeInvalidRequest {
			t.Fatalf("want one -32600 answer before the close, got %+v", msgs)
		}
		if code != websocket.StatusProtocolError {
			t.Fatalf("close code %d, want 1002", code)
		}
	})

	t.Run("unparseable first frame", func(t *testing.T) {
		c := dial(t, s)
		c.sendText("{not json")
		code, msgs := c.expectClose(5 * time.Second)
		if len(msgs) != 1 || msgs[0].Error == nil || msgs[0].Error.Code != acp.CodeParseError || string(msgs[0].ID) != "null" {
			t.Fatalf("want a -32700 answer with id null, got %+v", msgs)
		}
		if code != websocket.StatusProtocolError {
			t.Fatalf("close code %d, want 1002", code)
		}
	})

	c := dial(t, s)
	c.initialize()
	sid := c.newSession("/tmp/p")

	expectError := func(t *testing.T, wantCode int) message {
		t.Helper()
		m, err := c.read(5 * time.Second)
		if err != nil {
			t.Fatalf("no answer: %v", err)
		}
		if m.Error == nil || m.Error.Code != wantCode {
			t.Fatalf("want error %d, got %+v", wantCode, m)
		}
		return m
	}

	t.Run("unparseable frame", func(t *testing.T) {
		c.t = t
		c.sendText(`{"jsonrpc":"2.0","id":1,`)
		if m := expectError(t, acp.CodeParseError); string(m.ID) != "null" {
			t.Fatalf("parse error id %s, want null", m.ID)
		}
	})
	t.Run("unknown method", func(t *testing.T) {
		c.t = t
		if e, _ := c.call("session/frobnicate", map[string]any{}, nil); e == nil || e.Code != acp.CodeMethodNotFound {
			t.Fatalf("got %v", e)
		}
	})
	t.Run("unknown session", func(t *testing.T) {
		c.t = t
		if e, _ := c.call("session/prompt", textPrompt("no-such-session", "hi"), nil); e == nil || e.Code != acp.CodeNotFound {
			t.Fatalf("got %v", e)
		}
		if e, _ := c.call("session/load", map[string]any{"sessionId": "nope", "cwd": "/x", "mcpServers": []any{}}, nil); e == nil || e.Code != acp.CodeNotFound {
			t.Fatalf("load: got %v", e)
		}
	})
	t.Run("wrong types and missing fields", func(t *testing.T) {
		c.t = t
		for _, p := range []any{
			map[string]any{"cwd": 5, "mcpServers": []any{}},
			map[string]any{"mcpServers": []any{}},
			"a string",
		} {
			c.nextID++
			c.sendJSON(map[string]any{"jsonrpc": "2.0", "id": c.nextID, "method": "session/new", "params": p})
			m, err := c.read(5 * time.Second)
			if err != nil || m.Error == nil || (m.Error.Code != acp.CodeInvalidParams && m.Error.Code != acp.CodeInvalidRequest) {
				t.Fatalf("params %v: got %+v %v", p, m, err)
			}
		}
	})
	t.Run("second initialize", func(t *testing.T) {
		c.t = t
		if e, _ := c.call("initialize", map[string]any{"protocolVersion": 1}, nil); e == nil || e.Code != acp.CodeInvalidRequest {
			t.Fatalf("got %v", e)
		}
	})
	t.Run("binary frame ignored", func(t *testing.T) {
		c.t = t
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := c.ws.Write(ctx, websocket.MessageBinary, []byte(`{"jsonrpc":"2.0","id":77,"method":"session/list"}`)); err != nil {
			t.Fatal(err)
		}
		// The next answer is for the next text request, not the binary one.
		if stop, upd := c.prompt(sid, "after binary"); stop != acp.StopEndTurn || agentText(upd) != "after binary" {
			t.Fatalf("after binary: %s %q", stop, agentText(upd))
		}
	})

	t.Run("oversized frame", func(t *testing.T) {
		big := dial(t, s)
		big.initialize()
		big.sendText(`{"jsonrpc":"2.0","id":1,"method":"session/list","params":{"cwd":"` + strings.Repeat("a", 70000) + `"}}`)
		if code, _ := big.expectClose(5 * time.Second); code != websocket.StatusMessageTooBig {
			t.Fatalf("close code %d, want 1009", code)
		}
	})

	// The server is healthy for everyone else, and for this client.
	c.t = t
	if stop, upd := c.prompt(sid, "still fine"); stop != acp.StopEndTurn || agentText(upd) != "still fine" {
		t.Fatalf("after bad input: %s %q", stop, agentText(upd))
	}
	c.close()
	s.waitIdle(t, 2*time.Second)
}
