package acp

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"strings"
	"sync"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// pipe is an in-memory message transport; two ends make a connection.
type pipe struct {
	in, out   chan []byte
	done      chan struct{}
	closeOnce *sync.Once
	block     bool // Write blocks until closed (a peer that never reads)
}

func newPipe() (a, b *pipe) {
	ab, ba := make(chan []byte, 16), make(chan []byte, 16)
	done := make(chan struct{})
	once := &sync.Once{}
	return &pipe{in: ba, out: ab, done: done, closeOnce: once}, &pipe{in: ab, out: ba, done: done, closeOnce: once}
}

func (p *pipe) Read(ctx context.Context) ([]byte, error) {
	select { // what was sent before the close is still delivered
	case b := <-p.in:
		return b, nil
	default:
	}
	select {
	case b := <-p.in:
		return b, nil
	case <-p.done:
		return nil, io.EOF
	case <-ctx.Done():
		return nil, ctx.Err()
	}
}

func (p *pipe) Write(ctx context.Context, b []byte) error {
	if p.block {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-p.done:
			return io.ErrClosedPipe
		}
	}
	select {
	case p.out <- b:
		return nil
	case <-p.done:
		return io.ErrClosedPipe
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (p *pipe) Close() error {
	p.closeOnce.Do(func() { close(p.done) })
	return nil
}

// serve runs conn with h until the test ends; the channel yields Serve's
// result once.
func serve(t *testing.T, c *Conn, h Handler) <-chan error {
	t.Helper()
	errc := make(chan error, 1)
	done := make(chan struct{})
	go func() { errc <- c.Serve(context.Background(), h); close(done) }()
	t.Cleanup(func() {
		c.Close()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			t.Error("Serve did not return after Close")
		}
	})
	return errc
}

// rawPeer drives one end of a pipe with raw frames.
type rawPeer struct {
	t *testing.T
	p *pipe
}

func (r rawPeer) send(s string) {
	r.t.Helper()
	if err := r.p.Write(context.Background(), []byte(s)); err != nil {
		r.t.Fatalf("send: %v", err)
	}
}

func (r rawPeer) recv() map[string]any {
	r.t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	b, err := r.p.Read(ctx)
	if err != nil {
		r.t.Fatalf("recv: %v", err)
	}
	var m map[string]any
	if err := json.Unmarshal(b, &m); err != nil {
		r.t.Fatalf("recv %q: %v", b, err)
	}
	return m
}

func errCode(m map[string]any) int {
	e, ok := m["error"].(map[string]any)
	if !ok {
		return 0
	}
	return int(e["code"].(float64))
}

func echoHandler() Handler {
	return HandlerFunc(func(ctx context.Context, req *Request) (any, error) {
		switch req.Method {
		case "echo":
			return req.Params, nil
		case "block":
			<-ctx.Done()
			return nil, ctx.Err()
		case "boom":
			panic("boom")
		}
		return nil, Errorf(CodeMethodNotFound, "method not found: %s", req.Method)
	})
}

func TestBadInputAnswers(t *testing.T) {
	a, b := newPipe()
	serve(t, NewConn(a, nil), echoHandler())
	peer := rawPeer{t, b}
	cases := []struct {
		name, in string
		code     int
		id       any
	}{
		{"unparseable", `{"jsonrpc":`, CodeParseError, nil},
		{"not an object", `42`, CodeInvalidRequest, nil},
		{"batch", `[{"jsonrpc":"2.0","id":1,"method":"echo"}]`, CodeInvalidRequest, nil},
		{"object id", `{"jsonrpc":"2.0","id":{"a":1},"method":"echo"}`, CodeInvalidRequest, nil},
		{"wrong version", `{"jsonrpc":"1.0","id":7,"method":"echo"}`, CodeInvalidRequest, float64(7)},
		{"no method", `{"jsonrpc":"2.0","id":8}`, CodeInvalidRequest, float64(8)},
		{"method not string", `{"jsonrpc":"2.0","id":9,"method":5}`, CodeInvalidRequest, nil},
		{"scalar params", `{"jsonrpc":"2.0","id":10,"method":"echo","params":3}`, CodeInvalidRequest, float64(10)},
		{"unknown method", `{"jsonrpc":"2.0","id":"x","method":"nope"}`, CodeMethodNotFound, "x"},
		{"deep nesting", `{"jsonrpc":"2.0","id":11,"method":"echo","params":` + strings.Repeat("[", 200) + strings.Repeat("]", 200) + `}`, CodeInvalidRequest, nil},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			peer.t = t
			peer.send(tc.in)
			m := peer.recv()
			if got := errCode(m); got != tc.code {
				t.Fatalf("code %d, want %d (%v)", got, tc.code, m)
			}
			if m["id"] != tc.id {
				t.Fatalf("id %#v, want %#v", m["id"], tc.id)
			}
		})
	}
	// Still healthy, with a huge id echoed verbatim.
	peer.t = t
	peer.send(`{"jsonrpc":"2.0","id":123456789012345678901234567890,"method":"echo","params":{"a":1}}`)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	raw, err := b.Read(ctx)
	if err != nil || !strings.Contains(string(raw), `"id":123456789012345678901234567890`) {
		t.Fatalf("big id not echoed verbatim: %s %v", raw, err)
	}
}

func TestResponseToUnknownIDAndNotificationWithResult(t *testing.T) {
	a, b := newPipe()
	serve(t, NewConn(a, nil), echoHandler())
	peer := rawPeer{t, b}
	peer.send(`{"jsonrpc":"2.0","id":99,"result":{}}`) // nobody asked: dropped
	peer.send(`{"jsonrpc":"2.0","method":"echo","params":{}}`)
	peer.send(`{"jsonrpc":"2.0","id":1,"method":"echo","params":{"ok":true}}`)
	m := peer.recv()
	if m["id"] != float64(1) {
		t.Fatalf("the next message should be the answer to 1, got %v", m)
	}
}

func TestRequestsBothWays(t *testing.T) {
	a, b := newPipe()
	server := NewConn(a, nil)
	client := NewConn(b, nil)
	serve(t, server, echoHandler())
	serve(t, client, echoHandler())

	var out map[string]int
	if err := client.Call(context.Background(), "echo", map[string]int{"n": 1}, &out); err != nil || out["n"] != 1 {
		t.Fatalf("client->server: %v %v", out, err)
	}
	if err := server.Call(context.Background(), "echo", map[string]int{"n": 2}, &out); err != nil || out["n"] != 2 {
		t.Fatalf("server->client: %v %v", out, err)
	}
	err := client.Call(context.Background(), "nope", struct{}{}, nil)
	if !errors.Is(err, ErrMethodNotFound) {
		t.Fatalf("want method not found, got %v", err)
	}
}

func TestNotificationsInOrder(t *testing.T) {
	a, b := newPipe()
	var mu sync.Mutex
	var got []int
	done := make(chan struct{})
	h := HandlerFunc(func(ctx context.Context, req *Request) (any, error) {
		var p struct{ N int }
		_ = json.Unmarshal(req.Params, &p)
		n := p.N
		mu.Lock()
		got = append(got, n)
		if len(got) == 100 {
			close(done)
		}
		mu.Unlock()
		return nil, nil
	})
	serve(t, NewConn(a, nil), h)
	client := NewConn(b, nil)
	serve(t, client, echoHandler())
	for i := range 100 {
		if err := client.Notify(context.Background(), "n", map[string]int{"n": i}); err != nil {
			t.Fatal(err)
		}
	}
	select {
	case <-done:
	case <-time.After(5 * time.Second):
		t.Fatal("notifications not delivered")
	}
	for i, n := range got {
		if i != n {
			t.Fatalf("notification %d arrived as %d", n, i)
		}
	}
}

func TestCancelRequest(t *testing.T) {
	a, b := newPipe()
	serve(t, NewConn(a, nil), echoHandler())
	peer := rawPeer{t, b}
	peer.send(`{"jsonrpc":"2.0","id":"r1","method":"block","params":{}}`)
	peer.send(`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":"r1"}}`)
	m := peer.recv()
	if m["id"] != "r1" || errCode(m) != CodeCancelled {
		t.Fatalf("cancelled request answered %v", m)
	}
}

func TestCallCancelTellsPeer(t *testing.T) {
	a, b := newPipe()
	client := NewConn(a, nil)
	serve(t, client, echoHandler())
	peer := rawPeer{t, b}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() { errc <- client.Call(ctx, "slow", struct{}{}, nil) }()
	req := peer.recv()
	cancel()
	if err := <-errc; !errors.Is(err, context.Canceled) {
		t.Fatalf("Call returned %v", err)
	}
	note := peer.recv()
	if note["method"] != "$/cancel_request" {
		t.Fatalf("peer was not told: %v", note)
	}
	if p := note["params"].(map[string]any); p["requestId"] != req["id"] {
		t.Fatalf("cancel names %v, request was %v", p["requestId"], req["id"])
	}
}

func TestFirstMethodRule(t *testing.T) {
	t.Run("other first", func(t *testing.T) {
		a, b := newPipe()
		c := NewConn(a, &Options{FirstMethod: "initialize"})
		errc := serve(t, c, echoHandler())
		peer := rawPeer{t, b}
		peer.send(`{"jsonrpc":"2.0","id":1,"method":"echo","params":{}}`)
		if m := peer.recv(); errCode(m) != CodeInvalidRequest || m["id"] != float64(1) {
			t.Fatalf("got %v", m)
		}
		if err := <-errc; !errors.Is(err, ErrHandshake) {
			t.Fatalf("Serve returned %v", err)
		}
	})
	t.Run("second initialize", func(t *testing.T) {
		a, b := newPipe()
		c := NewConn(a, &Options{FirstMethod: "initialize"})
		serve(t, c, HandlerFunc(func(ctx context.Context, req *Request) (any, error) { return map[string]int{"protocolVersion": 1}, nil }))
		peer := rawPeer{t, b}
		peer.send(`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{}}`)
		if m := peer.recv(); errCode(m) != 0 {
			t.Fatalf("first initialize: %v", m)
		}
		select {
		case <-c.Initialized():
		default:
			t.Fatal("Initialized not closed")
		}
		peer.send(`{"jsonrpc":"2.0","id":2,"method":"initialize","params":{}}`)
		if m := peer.recv(); errCode(m) != CodeInvalidRequest {
			t.Fatalf("second initialize: %v", m)
		}
	})
}

func TestHandlerPanicClosesConnection(t *testing.T) {
	a, b := newPipe()
	c := NewConn(a, nil)
	errc := serve(t, c, echoHandler())
	peer := rawPeer{t, b}
	peer.send(`{"jsonrpc":"2.0","id":1,"method":"boom","params":{}}`)
	if m := peer.recv(); errCode(m) != CodeInternalError {
		t.Fatalf("panic answered %v", m)
	}
	if err := <-errc; !errors.Is(err, ErrHandlerPanic) {
		t.Fatalf("Serve returned %v", err)
	}
}

func TestPeerThatNeverReadsIsDropped(t *testing.T) {
	a, _ := newPipe()
	a.block = true
	c := NewConn(a, &Options{WriteTimeout: 50 * time.Millisecond})
	errc := serve(t, c, echoHandler())
	if err := c.Notify(context.Background(), "x", 1); err != nil {
		t.Fatal(err)
	}
	select {
	case err := <-errc:
		if !errors.Is(err, ErrWriteFailed) {
			t.Fatalf("Serve returned %v", err)
		}
	case <-time.After(5 * time.Second):
		t.Fatal("a peer that never reads was not dropped")
	}
}

func TestMaxInFlight(t *testing.T) {
	a, b := newPipe()
	serve(t, NewConn(a, &Options{MaxInFlight: 1}), echoHandler())
	peer := rawPeer{t, b}
	peer.send(`{"jsonrpc":"2.0","id":1,"method":"block","params":{}}`)
	// Wait until the first is running, then overflow.
	deadline := time.Now().Add(5 * time.Second)
	for {
		peer.send(`{"jsonrpc":"2.0","id":2,"method":"echo","params":{}}`)
		m := peer.recv()
		if errCode(m) == CodeRetryLater {
			break
		}
		if time.Now().After(deadline) {
			t.Fatal("no refusal past MaxInFlight")
		}
	}
}

func TestDuplicateRunningID(t *testing.T) {
	a, b := newPipe()
	serve(t, NewConn(a, nil), echoHandler())
	peer := rawPeer{t, b}
	peer.send(`{"jsonrpc":"2.0","id":5,"method":"block","params":{}}`)
	time.Sleep(10 * time.Millisecond) // let the first start; a miss only makes the check weaker
	peer.send(`{"jsonrpc":"2.0","id":5,"method":"block","params":{}}`)
	if m := peer.recv(); errCode(m) != CodeInvalidRequest {
		t.Fatalf("duplicate id answered %v", m)
	}
}

func TestDecodeParams(t *testing.T) {
	var v struct {
		Cwd string `json:"cwd"`
	}
	if err := DecodeParams(json.RawMessage(`{"cwd":5}`), &v); !errors.Is(err, ErrInvalidParams) || !strings.Contains(err.Error(), "cwd") {
		t.Fatalf("wrong type: %v", err)
	}
	if err := DecodeParams(nil, &v); !errors.Is(err, ErrInvalidParams) {
		t.Fatalf("missing: %v", err)
	}
	if err := DecodeParams(json.RawMessage(`{"cwd":"/x","_meta":{"a":1},"future":true}`), &v); err != nil || v.Cwd != "/x" {
		t.Fatalf("unknown fields must pass: %v", err)
	}
}

func TestContentBlockRoundTrip(t *testing.T) {
	in := `{"type":"image","data":"AAAA","mimeType":"image/png","_meta":{"k":"v"}}`
	var b ContentBlock
	if err := json.Unmarshal([]byte(in), &b); err != nil {
		t.Fatal(err)
	}
	out, _ := json.Marshal(b)
	if string(out) != in {
		t.Fatalf("round trip changed the block: %s", out)
	}
}

func TestFollowUpComesAfterResponse(t *testing.T) {
	a, b := newPipe()
	var c *Conn
	c = NewConn(a, nil)
	serve(t, c, HandlerFunc(func(ctx context.Context, req *Request) (any, error) {
		return FollowUp{Result: map[string]int{"n": 1}, Then: func() { _ = c.Notify(ctx, "after", map[string]int{}) }}, nil
	}))
	peer := rawPeer{t, b}
	peer.send(`{"jsonrpc":"2.0","id":1,"method":"x","params":{}}`)
	if m := peer.recv(); m["id"] != float64(1) || m["result"].(map[string]any)["n"] != float64(1) {
		t.Fatalf("first message %v, want the response", m)
	}
	if m := peer.recv(); m["method"] != "after" {
		t.Fatalf("second message %v, want the follow-up", m)
	}
}
