// Package wsconn serves ACP over WebSocket at /acp: the upgrade, the
// connection id, origin and size checks, keepalive, the message transport
// for acp, and the deferred on-disconnect hook that ends every runtime of
// the connection on every exit path.
package wsconn

import (
	"bufio"
	"context"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/coder/websocket"
	"github.com/google/uuid"

	"github.com/acpserver/acpserver/acp"
)

// HeaderConnectionID carries the connection id on the 101 response.
const HeaderConnectionID = "Acp-Connection-Id"

// Close codes this server sends, beyond the WebSocket defaults.
const (
	// CloseProtocolError (1002): the first message was not initialize.
	CloseProtocolError = websocket.StatusProtocolError
	// CloseTooBig (1009): a message exceeded the read limit.
	CloseTooBig = websocket.StatusMessageTooBig
	// CloseInternal (1011): a handler panicked.
	CloseInternal = websocket.StatusInternalError
	// CloseGoingAway (1001): the server is shutting down.
	CloseGoingAway = websocket.StatusGoingAway
	// ClosePolicy (1008): the handshake did not complete in time.
	ClosePolicy = websocket.StatusPolicyViolation
)

// ConnectFunc attaches a new connection to the session layer. It returns
// the handler for the connection's messages and the on-disconnect hook,
// which the caller runs in a defer.
type ConnectFunc func(connID string, conn *acp.Conn) (acp.Handler, func(), error)

// Options configure a Handler; zero values mean defaults.
type Options struct {
	Logger  *slog.Logger
	Connect ConnectFunc // required

	// ReadLimit is the largest accepted message; past it the connection
	// closes with 1009. Default 4 MiB.
	ReadLimit int64
	// PingInterval is how often a keepalive ping is sent; a ping not
	// answered within PingTimeout ends the connection. Default 30s and
	// 15s; a negative interval disables keepalive.
	PingInterval, PingTimeout time.Duration
	// WriteTimeout drops a peer that stops reading. Default 10s.
	WriteTimeout time.Duration
	// HandshakeTimeout bounds the wait for initialize. Default 30s.
	HandshakeTimeout time.Duration
	// MaxInFlight bounds concurrent requests per connection. Default 64.
	MaxInFlight int
	// OriginPatterns lists allowed Origin hosts (path.Match patterns).
	// Requests without an Origin header are always allowed. Default:
	// loopback origins only.
	OriginPatterns []string
	// AuthToken, when set, must arrive as "Authorization: Bearer TOKEN" on
	// the upgrade; otherwise the answer is 401. Compared in constant time.
	AuthToken []byte
	// MaxConnections bounds open connections; past it the upgrade gets 503
	// with Retry-After. 0 means no limit.
	MaxConnections int
}

// DefaultOriginPatterns allows only loopback browser origins.
var DefaultOriginPatterns = []string{"localhost", "localhost:*", "127.0.0.1", "127.0.0.1:*", "[::1]", "[::1]:*"}

// Handler is the /acp endpoint.
type Handler struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	conns    map[*acp.Conn]struct{}
	serving  int // connections between admission and return, upgrades included
	shutdown bool
	wg       sync.WaitGroup // one per served connection
	bg       sync.WaitGroup // Shutdown's waiter
}

// New returns a Handler.
func New(opts Options) *Handler {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.ReadLimit <= 0 {
		opts.ReadLimit = 4 << 20
	}
	if opts.PingInterval == 0 {
		opts.PingInterval = 30 * time.Second
	}
	if opts.PingTimeout <= 0 {
		opts.PingTimeout = 15 * time.Second
	}
	if opts.WriteTimeout <= 0 {
		opts.WriteTimeout = 10 * time.Second
	}
	if opts.HandshakeTimeout <= 0 {
		opts.HandshakeTimeout = 30 * time.Second
	}
	if opts.OriginPatterns == nil {
		opts.OriginPatterns = DefaultOriginPatterns
	}
	return &Handler{opts: opts, log: opts.Logger, conns: make(map[*acp.Conn]struct{})}
}

// Errors used as connection close causes.
var (
	ErrShutdown         = errors.New("wsconn: server shutting down")
	ErrKeepalive        = errors.New("wsconn: keepalive ping not answered")
	ErrHandshakeTimeout = errors.New("wsconn: initialize not received in time")
)

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !h.authorized(r) {
		h.log.Warn("upgrade refused: missing or wrong bearer token", "remote", r.RemoteAddr)
		w.Header().Set("WWW-Authenticate", `Bearer realm="acpserver"`)
		http.Error(w, "missing or wrong bearer token", http.StatusUnauthorized)
		return
	}
	h.mu.Lock()
	if h.shutdown {
		h.mu.Unlock()
		w.Header().Set("Retry-After", "5")
		http.Error(w, "server is shutting down", http.StatusServiceUnavailable)
		return
	}
	if h.opts.MaxConnections > 0 && h.serving >= h.opts.MaxConnections {
		h.mu.Unlock()
		h.log.Warn("upgrade refused: connection limit reached", "remote", r.RemoteAddr, "limit", h.opts.MaxConnections)
		w.Header().Set("Retry-After", "1")
		http.Error(w, "connection limit reached", http.StatusServiceUnavailable)
		return
	}
	h.serving++
	h.wg.Add(1)
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		h.serving--
		h.mu.Unlock()
		h.wg.Done()
	}()

	id := uuid.NewString()
	w.Header().Set(HeaderConnectionID, id)
	hw := &hijackRecorder{ResponseWriter: w}
	ws, err := websocket.Accept(hw, r, &websocket.AcceptOptions{OriginPatterns: h.opts.OriginPatterns})
	if err != nil {
		h.log.Info("websocket upgrade refused", "remote", r.RemoteAddr, "error", err)
		return
	}
	ws.SetReadLimit(h.opts.ReadLimit)
	log := h.log.With("connection_id", id)
	tr := &transport{ws: ws, raw: hw.conn, log: log}
	conn := acp.NewConn(tr, &acp.Options{
		Logger:       log,
		WriteTimeout: h.opts.WriteTimeout,
		MaxInFlight:  h.opts.MaxInFlight,
		FirstMethod:  acp.MethodInitialize,
	})

	h.mu.Lock()
	if h.shutdown {
		h.mu.Unlock()
		tr.CloseWithCause(ErrShutdown)
		return
	}
	h.conns[conn] = struct{}{}
	h.mu.Unlock()
	defer func() {
		h.mu.Lock()
		delete(h.conns, conn)
		h.mu.Unlock()
	}()

	handler, disconnect, err := h.opts.Connect(id, conn)
	if err != nil {
		tr.CloseWithCause(ErrShutdown)
		return
	}
	// The on-disconnect hook: every way out of this function reaches it.
	defer disconnect()
	log.Info("connection opened", "remote", r.RemoteAddr)

	// Watchers (keepalive, handshake timer) are owned here: cancelled and
	// joined before the hook runs.
	var watchers sync.WaitGroup
	wctx, stopWatchers := context.WithCancel(context.Background())
	defer func() {
		stopWatchers()
		watchers.Wait()
	}()
	watchers.Go(func() { h.watchHandshake(wctx, conn) })
	if h.opts.PingInterval > 0 {
		watchers.Go(func() { h.keepalive(wctx, conn, ws) })
	}

	err = conn.Serve(context.Background(), handler)
	log.Info("connection closed", "cause", describe(err))
}

// authorized checks the bearer token, in constant time, when one is set.
func (h *Handler) authorized(r *http.Request) bool {
	if len(h.opts.AuthToken) == 0 {
		return true
	}
	got, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
	if !ok {
		return false
	}
	return subtle.ConstantTimeCompare([]byte(strings.TrimSpace(got)), h.opts.AuthToken) == 1
}

func describe(err error) string {
	switch {
	case err == nil, errors.Is(err, io.EOF):
		return "eof"
	case websocket.CloseStatus(err) != -1:
		return fmt.Sprintf("peer close %d", websocket.CloseStatus(err))
	}
	return err.Error()
}

func (h *Handler) watchHandshake(ctx context.Context, conn *acp.Conn) {
	t := time.NewTimer(h.opts.HandshakeTimeout)
	defer t.Stop()
	select {
	case <-ctx.Done():
	case <-conn.Done():
	case <-conn.Initialized():
	case <-t.C:
		conn.CloseWithCause(ErrHandshakeTimeout)
	}
}

func (h *Handler) keepalive(ctx context.Context, conn *acp.Conn, ws *websocket.Conn) {
	t := time.NewTicker(h.opts.PingInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-conn.Done():
			return
		case <-t.C:
		}
		pctx, cancel := context.WithTimeout(ctx, h.opts.PingTimeout)
		err := ws.Ping(pctx)
		cancel()
		if err != nil {
			if ctx.Err() == nil {
				conn.CloseWithCause(fmt.Errorf("%w: %w", ErrKeepalive, err))
			}
			return
		}
	}
}

// Shutdown refuses new connections, closes every open one with 1001 and
// waits (bounded by ctx) for their handlers, disconnect hooks included, to
// return.
func (h *Handler) Shutdown(ctx context.Context) error {
	h.mu.Lock()
	h.shutdown = true
	conns := make([]*acp.Conn, 0, len(h.conns))
	for c := range h.conns {
		conns = append(conns, c)
	}
	h.mu.Unlock()
	var closers sync.WaitGroup
	for _, c := range conns {
		closers.Go(func() { c.CloseWithCause(ErrShutdown) })
	}
	closers.Wait()
	done := make(chan struct{})
	h.bg.Go(func() { h.wg.Wait(); close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		return ctx.Err() // Wait joins what is still ending
	}
}

// Wait joins every connection handler, including those still ending after
// Shutdown's deadline.
func (h *Handler) Wait() {
	h.wg.Wait()
	h.bg.Wait()
}

// Connections is the number of open WebSocket connections.
func (h *Handler) Connections() int {
	h.mu.Lock()
	defer h.mu.Unlock()
	return len(h.conns)
}

// transport adapts a WebSocket to acp.Transport: one text frame is one
// message; binary frames are ignored.
type transport struct {
	ws  *websocket.Conn
	raw net.Conn // the hijacked socket, to force a close that hangs
	log *slog.Logger
}

func (t *transport) Read(ctx context.Context) ([]byte, error) {
	for {
		typ, b, err := t.ws.Read(ctx)
		if err != nil {
			return nil, err
		}
		if typ != websocket.MessageText {
			t.log.Debug("binary frame ignored", "bytes", len(b))
			continue
		}
		return b, nil
	}
}

func (t *transport) Write(ctx context.Context, msg []byte) error {
	return t.ws.Write(ctx, websocket.MessageText, msg)
}

func (t *transport) Close() error { return t.ws.CloseNow() }

// closeHandshakeTimeout bounds a polite close; past it the socket is cut.
const closeHandshakeTimeout = time.Second

// CloseWithCause sends the close code that matches cause, bounded in time.
func (t *transport) CloseWithCause(cause error) error {
	code, reason := closeCode(cause)
	if code < 0 {
		return t.ws.CloseNow()
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		_ = t.ws.Close(code, reason)
	}()
	timer := time.NewTimer(closeHandshakeTimeout)
	defer timer.Stop()
	select {
	case <-done:
	case <-timer.C:
		if t.raw != nil {
			t.raw.Close()
		}
		<-done
	}
	return nil
}

// closeCode maps a close cause to the code sent; -1 means cut the socket
// without a handshake (the peer is gone or not reading).
func closeCode(cause error) (websocket.StatusCode, string) {
	switch {
	case errors.Is(cause, acp.ErrHandshake):
		return CloseProtocolError, "first message must be initialize"
	case errors.Is(cause, acp.ErrHandlerPanic):
		return CloseInternal, "internal error"
	case errors.Is(cause, ErrShutdown):
		return CloseGoingAway, "server shutting down"
	case errors.Is(cause, ErrHandshakeTimeout):
		return ClosePolicy, "initialize not received in time"
	case errors.Is(cause, acp.ErrClosed):
		return websocket.StatusNormalClosure, ""
	}
	return -1, ""
}

// hijackRecorder keeps the net.Conn the WebSocket library hijacks, so a
// close that hangs can be forced.
type hijackRecorder struct {
	http.ResponseWriter
	conn net.Conn
}

func (h *hijackRecorder) Hijack() (net.Conn, *bufio.ReadWriter, error) {
	hj, ok := h.ResponseWriter.(http.Hijacker)
	if !ok {
		return nil, nil, errors.New("wsconn: response writer cannot hijack")
	}
	c, rw, err := hj.Hijack()
	h.conn = c
	return c, rw, err
}

// Flush passes through so the upgrade response is written promptly.
func (h *hijackRecorder) Flush() {
	if f, ok := h.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}
