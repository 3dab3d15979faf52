package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/internal/cutproxy"
	"github.com/acpserver/acpserver/sessionmgr"
	"github.com/acpserver/acpserver/wsconn"
)

// testServer is an in-process acpserver: the real session manager behind
// the real WebSocket handler.
type testServer struct {
	mgr *sessionmgr.Manager
	ws  *wsconn.Handler
	srv *httptest.Server
}

func startServer(t *testing.T) *testServer {
	t.Helper()
	mgr := sessionmgr.New(sessionmgr.Options{})
	ws := wsconn.New(wsconn.Options{
		Connect: func(id string, conn *acp.Conn) (acp.Handler, func(), error) {
			c, err := mgr.Connect(id, conn)
			if err != nil {
				return nil, nil, err
			}
			return c, c.Disconnect, nil
		},
		PingInterval: -1,
	})
	s := &testServer{mgr: mgr, ws: ws, srv: httptest.NewServer(ws)}
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
		defer cancel()
		mgr.Shutdown(ctx)
		ws.Shutdown(ctx)
		s.srv.Close()
		mgr.Wait()
	})
	return s
}

// waitFor polls cond until it holds or the test's patience ends.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(20 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s never held", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

// ide is the IDE's end of the bridge's stdio.
type ide struct {
	t      *testing.T
	in     *io.PipeWriter // the bridge's stdin
	out    *acp.StdioTransport
	nextID int
	done   chan error
}

func startBridge(t *testing.T, opts Options) *ide {
	t.Helper()
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	tr := acp.NewStdioTransport(inR, outW, nil)
	c := &ide{t: t, in: inW, out: acp.NewStdioTransport(outR, io.Discard, nil), done: make(chan error, 1)}
	if opts.MinBackoff == 0 {
		opts.MinBackoff = 10 * time.Millisecond
		opts.MaxBackoff = 100 * time.Millisecond
	}
	go func() { c.done <- Run(context.Background(), tr, &opts) }()
	t.Cleanup(func() {
		inW.Close()
		select {
		case <-c.done:
		case <-time.After(20 * time.Second):
			t.Error("bridge did not return after stdin EOF")
		}
		c.out.Close()
		<-c.out.ReaderDone()
		<-tr.ReaderDone()
	})
	return c
}

type msg struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *acp.Error      `json:"error,omitempty"`
}

func (c *ide) send(method string, params any) string {
	c.t.Helper()
	c.nextID++
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": c.nextID, "method": method, "params": params})
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
	return string(b[strings.Index(string(b), `"id":`)+5 : strings.Index(string(b), `,"jsonrpc"`)])
}

func (c *ide) notify(method string, params any) {
	c.t.Helper()
	b, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": method, "params": params})
	if _, err := c.in.Write(append(b, '\n')); err != nil {
		c.t.Fatal(err)
	}
}

func (c *ide) read() msg {
	c.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	b, err := c.out.Read(ctx)
	if err != nil {
		c.t.Fatalf("reading the bridge's stdout: %v", err)
	}
	var m msg
	if err := json.Unmarshal(b, &m); err != nil {
		c.t.Fatalf("bad line %q: %v", b, err)
	}
	return m
}

// await returns the response to id and the messages before it.
func (c *ide) await(id string) (msg, []msg) {
	c.t.Helper()
	var before []msg
	for {
		m := c.read()
		if m.Method == "" && string(m.ID) == id {
			return m, before
		}
		if m.Method == "" {
			c.t.Fatalf("unexpected response %s (waiting for %s): %+v", m.ID, id, m)
		}
		before = append(before, m)
	}
}

func (c *ide) call(method string, params any) (msg, []msg) {
	c.t.Helper()
	return c.await(c.send(method, params))
}

func prompt(sid, text string) map[string]any {
	return map[string]any{"sessionId": sid, "prompt": []map[string]any{{"type": "text", "text": text}}}
}

func echoed(ms []msg) string {
	var sb strings.Builder
	for _, m := range ms {
		var p struct {
			Update struct {
				SessionUpdate string `json:"sessionUpdate"`
				Content       struct {
					Text string `json:"text"`
				} `json:"content"`
			} `json:"update"`
		}
		if json.Unmarshal(m.Params, &p) == nil && p.Update.SessionUpdate == "agent_message_chunk" {
			sb.WriteString(p.Update.Content.Text)
		}
	}
	return sb.String()
}

func TestBridgeSurvivesLinkLoss(t *testing.T) {
	s := startServer(t)
	p := cutproxy.Start(t, s.srv.Listener.Addr().String())
	c := startBridge(t, Options{URL: "ws://" + p.Addr() + "/acp"})

	resp, _ := c.call("initialize", map[string]any{"protocolVersion": 1, "clientCapabilities": map[string]any{}})
	if resp.Error != nil {
		t.Fatalf("initialize: %v", resp.Error)
	}
	resp, _ = c.call("session/new", map[string]any{"cwd": "/tmp/work", "mcpServers": []any{}})
	var ns struct{ SessionID string }
	if resp.Error != nil || json.Unmarshal(resp.Result, &ns) != nil || ns.SessionID == "" {
		t.Fatalf("session/new: %+v", resp)
	}
	sid := ns.SessionID
	resp, before := c.call("session/prompt", prompt(sid, "hello"))
	if resp.Error != nil || echoed(before) != "hello" {
		t.Fatalf("prompt: %+v %q", resp, echoed(before))
	}

	// A long prompt is running when the link drops: it is answered with an
	// error, not left hanging.
	id := c.send("session/prompt", prompt(sid, "/sleep 60s"))
	if m := c.read(); m.Method != "session/update" {
		t.Fatalf("want the turn's first update, got %+v", m)
	}
	p.Cut()
	resp, _ = c.await(id)
	if resp.Error == nil || resp.Error.Code != CodeLinkLost || !strings.Contains(resp.Error.Message, "prompt") {
		t.Fatalf("prompt in flight at the cut: %+v", resp)
	}
	// The old runtime ends with its connection; the resumed one lives on
	// the new connection.
	waitFor(t, "old connection gone and session resumed", func() bool {
		sn := s.mgr.Snapshot()
		return sn.Ended[sessionmgr.ReasonDisconnected]+sn.Ended[sessionmgr.ReasonSuperseded] == 1 && sn.Sessions == 1 && sn.Connections == 1
	})

	// The IDE keeps its session id and its next prompt works; no second
	// initialize result reaches it.
	resp, before = c.call("session/prompt", prompt(sid, "after the cut"))
	if resp.Error != nil || echoed(before) != "after the cut" {
		t.Fatalf("prompt after reconnect: %+v %q", resp, echoed(before))
	}
	for _, m := range before {
		if m.Method != "session/update" {
			t.Fatalf("unexpected message to the IDE: %+v", m)
		}
	}

	// Close forgets the session: a second cut resumes nothing.
	if resp, _ := c.call("session/close", map[string]any{"sessionId": sid}); resp.Error != nil {
		t.Fatalf("close: %+v", resp)
	}
	p.Cut()
	waitFor(t, "reconnected with no sessions", func() bool {
		sn := s.mgr.Snapshot()
		return p.Accepts() == 3 && sn.Connections == 1 && sn.Sessions == 0
	})
	resp, _ = c.call("session/list", map[string]any{})
	if resp.Error != nil {
		t.Fatalf("list after second cut: %+v", resp)
	}

	// stdin EOF: the bridge closes normally and returns nil.
	c.in.Close()
	if err := <-c.done; err != nil {
		t.Fatalf("Run after stdin EOF: %v", err)
	}
	c.done <- nil // for the cleanup
	waitFor(t, "server saw the disconnect", func() bool { return s.mgr.Snapshot().Connections == 0 })
}

func TestBridgeOutageFailsRequestsInBoundedTime(t *testing.T) {
	// Nothing listens: the link never comes up.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := ln.Addr().String()
	ln.Close()
	c := startBridge(t, Options{URL: "ws://" + addr + "/acp", OutageWait: 50 * time.Millisecond})
	resp, _ := c.call("initialize", map[string]any{"protocolVersion": 1})
	if resp.Error == nil || resp.Error.Code != CodeUnavailable {
		t.Fatalf("initialize during an outage: %+v", resp)
	}
	// A held request the IDE cancels is answered cancelled.
	c2 := c.send("session/list", map[string]any{})
	c.notify("$/cancel_request", map[string]any{"requestId": json.RawMessage(c2)})
	resp, _ = c.await(c2)
	if resp.Error == nil || !errors.Is(resp.Error, acp.ErrCancelled) && resp.Error.Code != CodeUnavailable {
		t.Fatalf("cancelled held request: %+v", resp)
	}
}
