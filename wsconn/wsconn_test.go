package wsconn

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/coder/websocket"
	"go.uber.org/goleak"

	"github.com/acpserver/acpserver/acp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// hookCounter is a session layer stand-in that counts connects and
// disconnect hooks.
type hookCounter struct {
	connects, disconnects atomic.Int64
	handler               acp.Handler
}

func (h *hookCounter) connect(id string, conn *acp.Conn) (acp.Handler, func(), error) {
	h.connects.Add(1)
	return h.handler, func() { h.disconnects.Add(1) }, nil
}

func newTestServer(t *testing.T, opts Options, hc *hookCounter) (*Handler, string) {
	t.Helper()
	if hc.handler == nil {
		hc.handler = acp.HandlerFunc(func(ctx context.Context, req *acp.Request) (any, error) {
			switch req.Method {
			case "initialize":
				return map[string]int{"protocolVersion": 1}, nil
			case "panic":
				panic("handler bug")
			}
			return nil, acp.ErrMethodNotFound
		})
	}
	opts.Connect = hc.connect
	h := New(opts)
	srv := httptest.NewServer(h)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		if err := h.Shutdown(ctx); err != nil {
			t.Errorf("shutdown: %v", err)
		}
		srv.Close()
	})
	return h, "ws" + strings.TrimPrefix(srv.URL, "http")
}

func dialT(t *testing.T, url string) (*websocket.Conn, *http.Response) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	c, resp, err := websocket.Dial(ctx, url, nil)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.CloseNow() })
	return c, resp
}

func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(5 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("%s never happened", what)
		}
		time.Sleep(5 * time.Millisecond)
	}
}

func write(t *testing.T, c *websocket.Conn, s string) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := c.Write(ctx, websocket.MessageText, []byte(s)); err != nil {
		t.Fatal(err)
	}
}

func readUntilClose(t *testing.T, c *websocket.Conn) websocket.StatusCode {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for {
		if _, _, err := c.Read(ctx); err != nil {
			return websocket.CloseStatus(err)
		}
	}
}

func TestConnectionIDHeaderAndHook(t *testing.T) {
	hc := &hookCounter{}
	_, url := newTestServer(t, Options{}, hc)
	c, resp := dialT(t, url)
	if id := resp.Header.Get(HeaderConnectionID); len(id) != 36 {
		t.Fatalf("connection id %q", id)
	}
	write(t, c, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`)
	c.Close(websocket.StatusNormalClosure, "")
	waitFor(t, "disconnect hook", func() bool { return hc.disconnects.Load() == 1 })
}

// TestKeepaliveDropsDeadPeer: a client that never reads never answers
// pings; the server drops it and the hook runs.
func TestKeepaliveDropsDeadPeer(t *testing.T) {
	hc := &hookCounter{}
	_, url := newTestServer(t, Options{PingInterval: 20 * time.Millisecond, PingTimeout: 50 * time.Millisecond}, hc)
	c, _ := dialT(t, url)
	write(t, c, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`)
	// Not reading: pongs are never sent.
	waitFor(t, "disconnect hook after missed pings", func() bool { return hc.disconnects.Load() == 1 })
}

func TestPanicReachesHook(t *testing.T) {
	hc := &hookCounter{}
	_, url := newTestServer(t, Options{}, hc)
	c, _ := dialT(t, url)
	write(t, c, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`)
	write(t, c, `{"jsonrpc":"2.0","id":2,"method":"panic","params":{}}`)
	if code := readUntilClose(t, c); code != CloseInternal {
		t.Fatalf("close code %d, want 1011", code)
	}
	waitFor(t, "disconnect hook after panic", func() bool { return hc.disconnects.Load() == 1 })
}

func TestHandshakeTimeout(t *testing.T) {
	hc := &hookCounter{}
	_, url := newTestServer(t, Options{HandshakeTimeout: 50 * time.Millisecond}, hc)
	c, _ := dialT(t, url)
	if code := readUntilClose(t, c); code != ClosePolicy {
		t.Fatalf("close code %d, want 1008", code)
	}
	waitFor(t, "disconnect hook", func() bool { return hc.disconnects.Load() == 1 })
}

func TestShutdownClosesWithGoingAway(t *testing.T) {
	hc := &hookCounter{}
	h, url := newTestServer(t, Options{}, hc)
	c, _ := dialT(t, url)
	write(t, c, `{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`)
	waitFor(t, "connection registered", func() bool { return h.Connections() == 1 })
	codec := make(chan websocket.StatusCode, 1)
	go func() { codec <- readUntilClose(t, c) }()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	if err := h.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	if code := <-codec; code != CloseGoingAway {
		t.Fatalf("close code %d, want 1001", code)
	}
	if hc.disconnects.Load() != 1 {
		t.Fatal("hook did not run before Shutdown returned")
	}
	// New upgrades are refused.
	ctx2, cancel2 := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel2()
	_, resp, err := websocket.Dial(ctx2, url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable {
		t.Fatalf("dial after shutdown: %v %v", resp, err)
	}
}

func TestOriginCheck(t *testing.T) {
	hc := &hookCounter{}
	_, url := newTestServer(t, Options{}, hc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"https://evil.example"}}})
	if err == nil || resp == nil || resp.StatusCode != http.StatusForbidden {
		t.Fatalf("foreign origin: %v %v", resp, err)
	}
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Origin": {"http://localhost:3000"}}})
	if err != nil {
		t.Fatalf("loopback origin refused: %v", err)
	}
	c.CloseNow()
}

func TestCloseCodes(t *testing.T) {
	for _, tc := range []struct {
		cause error
		code  websocket.StatusCode
	}{
		{acp.ErrHandshake, CloseProtocolError},
		{acp.ErrHandlerPanic, CloseInternal},
		{ErrShutdown, CloseGoingAway},
		{ErrHandshakeTimeout, ClosePolicy},
		{acp.ErrClosed, websocket.StatusNormalClosure},
		{errors.New("read: connection reset"), -1},
	} {
		if got, _ := closeCode(tc.cause); got != tc.code {
			t.Errorf("%v: code %d, want %d", tc.cause, got, tc.code)
		}
	}
}

func TestBearerToken(t *testing.T) {
	hc := &hookCounter{}
	_, url := newTestServer(t, Options{AuthToken: []byte("s3cret")}, hc)
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	for _, hdr := range []http.Header{
		nil,
		{"Authorization": {"Bearer wrong"}},
		{"Authorization": {"Basic czNjcmV0"}},
		{"Authorization": {"Bearer s3cret-and-more"}},
	} {
		_, resp, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: hdr})
		if err == nil || resp == nil || resp.StatusCode != http.StatusUnauthorized {
			t.Fatalf("header %v: %v %v", hdr, resp, err)
		}
	}
	c, _, err := websocket.Dial(ctx, url, &websocket.DialOptions{HTTPHeader: http.Header{"Authorization": {"Bearer s3cret"}}})
	if err != nil {
		t.Fatalf("right token refused: %v", err)
	}
	waitFor(t, "the accepted connection reaching the session layer", func() bool { return hc.connects.Load() == 1 })
	c.CloseNow()
}

func TestMaxConnections(t *testing.T) {
	hc := &hookCounter{}
	h, url := newTestServer(t, Options{MaxConnections: 2}, hc)
	dialT(t, url)
	dialT(t, url)
	waitFor(t, "two connections", func() bool { return h.Connections() == 2 })
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	_, resp, err := websocket.Dial(ctx, url, nil)
	if err == nil || resp == nil || resp.StatusCode != http.StatusServiceUnavailable || resp.Header.Get("Retry-After") == "" {
		t.Fatalf("third connection: %v %v", resp, err)
	}
}
