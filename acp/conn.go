package acp

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"runtime/debug"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// Transport moves whole messages: one JSON value per Read or Write. Read and
// Write are each called from one goroutine at a time. Close may race with
// Read and Write and must unblock both; it is idempotent.
type Transport interface {
	Read(ctx context.Context) ([]byte, error)
	Write(ctx context.Context, msg []byte) error
	Close() error
}

// Handler serves incoming requests and notifications. Requests run
// concurrently, each in its own goroutine; notifications are delivered one
// at a time in arrival order. The context is cancelled when the peer sends
// $/cancel_request for the request or when the connection ends. For a
// notification the result is ignored.
type Handler interface {
	Handle(ctx context.Context, req *Request) (result any, err error)
}

// HandlerFunc adapts a function to Handler.
type HandlerFunc func(ctx context.Context, req *Request) (any, error)

// Handle calls f.
func (f HandlerFunc) Handle(ctx context.Context, req *Request) (any, error) { return f(ctx, req) }

// Options tune a Conn; nil means defaults.
type Options struct {
	// Logger receives protocol warnings; nil discards.
	Logger *slog.Logger
	// WriteTimeout bounds every write; a peer that stops reading is dropped
	// after it. Default 10s.
	WriteTimeout time.Duration
	// CallTimeout bounds an outgoing request whose context has no deadline.
	// Default 5m (a person may be deciding on a permission prompt).
	CallTimeout time.Duration
	// MaxInFlight bounds concurrently running incoming requests; past it a
	// request is answered at once with a server error. 0 means 64.
	MaxInFlight int
	// FirstMethod, when set, must be the method of the first message; any
	// other first message is answered with an error and ends the connection
	// with ErrHandshake. A second call of it is refused.
	FirstMethod string
}

// ErrHandshake ends Serve when the first message is not Options.FirstMethod.
var ErrHandshake = errors.New("acp: first message was not the handshake method")

// ErrClosed is returned by calls on a closed connection.
var ErrClosed = errors.New("acp: connection closed")

// ErrHandlerPanic is the close cause after a handler panicked.
var ErrHandlerPanic = errors.New("acp: handler panicked")

// ErrWriteFailed is the close cause after a write failed or timed out.
var ErrWriteFailed = errors.New("acp: write failed")

// cancelRequestMethod is the protocol-level cancellation notification.
const cancelRequestMethod = "$/cancel_request"

// Conn is one JSON-RPC peer over a Transport. It owns a writer goroutine,
// one goroutine per running request and one for ordered notifications;
// Serve joins them all before it returns.
type Conn struct {
	t    Transport
	opts Options
	log  *slog.Logger

	ctx    context.Context // the connection's lifetime; cancelled with a cause
	cancel context.CancelCauseFunc

	outbox     chan outMsg
	writerDone chan struct{}

	mu       sync.Mutex
	pending  map[string]chan *wireMsg           // our outgoing calls by id
	running  map[string]context.CancelCauseFunc // incoming requests by raw id
	nextID   atomic.Int64
	inflight atomic.Int64

	handlers sync.WaitGroup
	notes    chan *Request

	closeOnce sync.Once
	started   atomic.Bool
	inited    atomic.Bool
	initCh    chan struct{}
}

// NewConn wraps t. Nothing runs until Serve.
func NewConn(t Transport, opts *Options) *Conn {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.CallTimeout <= 0 {
		o.CallTimeout = 5 * time.Minute
	}
	if o.MaxInFlight <= 0 {
		o.MaxInFlight = 64
	}
	log := o.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ctx, cancel := context.WithCancelCause(context.Background())
	return &Conn{
		t:          t,
		opts:       o,
		log:        log,
		ctx:        ctx,
		cancel:     cancel,
		outbox:     make(chan outMsg, 64),
		writerDone: make(chan struct{}),
		pending:    make(map[string]chan *wireMsg),
		running:    make(map[string]context.CancelCauseFunc),
		notes:      make(chan *Request, 256),
		initCh:     make(chan struct{}),
	}
}

// Done is closed when the connection has ended.
func (c *Conn) Done() <-chan struct{} { return c.ctx.Done() }

// Err is the cause the connection ended with, nil while it is open.
func (c *Conn) Err() error {
	if c.ctx.Err() == nil {
		return nil
	}
	return context.Cause(c.ctx)
}

// InFlight is the number of incoming requests being handled now.
func (c *Conn) InFlight() int { return int(c.inflight.Load()) }

// Close ends the connection with cause ErrClosed. It is idempotent and may
// race with everything else; Serve still does the joining.
func (c *Conn) Close() error {
	c.CloseWithCause(ErrClosed)
	return nil
}

// CauseCloser is implemented by transports that can tell the peer why the
// connection ends (a WebSocket close code). CloseWithCause must be bounded
// in time, unblock Read and Write, and be idempotent.
type CauseCloser interface {
	CloseWithCause(cause error) error
}

// CloseWithCause ends the connection, recording why. The first cause wins;
// concurrent callers return once the transport is closed.
func (c *Conn) CloseWithCause(cause error) {
	c.closeOnce.Do(func() {
		if cc, ok := c.t.(CauseCloser); ok {
			cc.CloseWithCause(cause)
		} else {
			c.t.Close()
		}
		c.cancel(cause)
	})
}

// Initialized is closed once the FirstMethod request has arrived.
func (c *Conn) Initialized() <-chan struct{} { return c.initCh }

// Serve reads and dispatches messages until the transport fails or the
// connection is closed, then cancels and joins every goroutine it started.
// It returns the cause the connection ended with (io.EOF for a clean end).
func (c *Conn) Serve(ctx context.Context, h Handler) error {
	if !c.started.CompareAndSwap(false, true) {
		return errors.New("acp: Serve called twice")
	}
	stop := context.AfterFunc(ctx, func() { c.CloseWithCause(context.Cause(ctx)) })
	defer stop()

	go c.writeLoop()
	notesDone := make(chan struct{})
	go c.notificationLoop(h, notesDone)

	c.readLoop(h)

	// Teardown: make sure everything sees the end, then join.
	c.CloseWithCause(io.EOF)
	close(c.notes)
	<-notesDone
	c.handlers.Wait()
	<-c.writerDone
	c.failPending()
	return context.Cause(c.ctx)
}

func (c *Conn) readLoop(h Handler) {
	first := c.opts.FirstMethod != ""
	for {
		data, err := c.t.Read(c.ctx)
		if err != nil {
			c.CloseWithCause(err)
			return
		}
		d := decode(data)
		if first {
			first = false
			if d.req == nil || d.req.Method != c.opts.FirstMethod || d.req.IsNotification() {
				id := d.id
				if d.req != nil && d.req.ID != nil {
					id = d.req.ID
				}
				if id == nil {
					id = nullID
				}
				e := d.err // a malformed first message gets its own error
				if e == nil {
					e = Errorf(CodeInvalidRequest, "invalid request: the first message must be a %q request", c.opts.FirstMethod)
				}
				c.sendResponse(id, nil, e)
				c.flushAndClose(ErrHandshake)
				return
			}
		}
		switch {
		case d.err != nil:
			c.log.Debug("rejected message", "error", d.err.Message)
			c.sendResponse(d.id, nil, d.err)
		case d.resp != nil:
			c.deliverResponse(d.resp)
		case d.req.IsNotification():
			if d.req.Method == cancelRequestMethod {
				c.cancelIncoming(d.req.Params)
				continue
			}
			select {
			case c.notes <- d.req:
			case <-c.ctx.Done():
				return
			}
		default:
			c.startRequest(h, d.req)
		}
	}
}

// outMsg is one queued write, or (with closeCause set) the instruction to
// end the connection once everything queued before it is written.
type outMsg struct {
	b          []byte
	closeCause error
}

// flushAndClose ends the connection with cause after the messages queued so
// far reach the peer, waiting at most the write timeout.
func (c *Conn) flushAndClose(cause error) {
	t := time.NewTimer(c.opts.WriteTimeout)
	defer t.Stop()
	select {
	case c.outbox <- outMsg{closeCause: cause}:
	case <-c.ctx.Done():
		return
	case <-t.C:
		c.CloseWithCause(cause)
		return
	}
	select {
	case <-c.ctx.Done():
	case <-t.C:
		c.CloseWithCause(cause)
	}
}

func (c *Conn) startRequest(h Handler, req *Request) {
	if c.opts.FirstMethod != "" && req.Method == c.opts.FirstMethod {
		if !c.inited.CompareAndSwap(false, true) {
			c.sendResponse(req.ID, nil, Errorf(CodeInvalidRequest, "invalid request: %s was already called on this connection", req.Method))
			return
		}
		close(c.initCh)
	}
	if int(c.inflight.Load()) >= c.opts.MaxInFlight {
		c.sendResponse(req.ID, nil, Errorf(CodeRetryLater, "too many requests in flight on this connection (limit %d)", c.opts.MaxInFlight))
		return
	}
	key := string(req.ID)
	ctx, cancel := context.WithCancelCause(c.ctx)
	c.mu.Lock()
	if _, dup := c.running[key]; dup {
		c.mu.Unlock()
		cancel(nil)
		c.sendResponse(req.ID, nil, Errorf(CodeInvalidRequest, "invalid request: id %s is already in use by a running request", key))
		return
	}
	c.running[key] = cancel
	c.mu.Unlock()
	c.inflight.Add(1)
	c.handlers.Add(1)
	go func() {
		defer c.handlers.Done()
		defer c.inflight.Add(-1)
		defer func() {
			c.mu.Lock()
			delete(c.running, key)
			c.mu.Unlock()
			cancel(nil)
		}()
		result, err, panicked := c.call(ctx, h, req)
		if err != nil && ctx.Err() != nil && errors.Is(context.Cause(ctx), errPeerCancelled) {
			var je *Error
			if !errors.As(err, &je) || je.Code != CodeCancelled {
				err = Errorf(CodeCancelled, "request cancelled")
			}
		}
		var follow func()
		if fu, ok := result.(FollowUp); ok {
			result, follow = fu.Result, fu.Then
		}
		c.sendResponse(req.ID, result, toError(err))
		if panicked {
			c.flushAndClose(ErrHandlerPanic)
			return
		}
		if follow != nil && err == nil {
			follow()
		}
	}()
}

// FollowUp lets a handler send messages that must reach the peer after its
// response (for instance updates about a session the response creates).
// Then runs in the handler's goroutine once the response is queued.
type FollowUp struct {
	Result any
	Then   func()
}

var errPeerCancelled = errors.New("cancelled by the peer ($/cancel_request)")

// call runs the handler, turning a panic into an internal error that also
// ends the connection: the handler's state can no longer be trusted.
func (c *Conn) call(ctx context.Context, h Handler, req *Request) (result any, err error, panicked bool) {
	defer func() {
		if p := recover(); p != nil {
			c.log.Error("handler panicked; closing connection", "method", req.Method, "panic", fmt.Sprint(p), "stack", string(debug.Stack()))
			result, err, panicked = nil, Errorf(CodeInternalError, "internal error"), true
		}
	}()
	result, err = h.Handle(ctx, req)
	return result, err, false
}

func toError(err error) *Error {
	if err == nil {
		return nil
	}
	var je *Error
	if errors.As(err, &je) {
		return je
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return Errorf(CodeCancelled, "request cancelled: %v", err)
	}
	return Errorf(CodeInternalError, "internal error: %v", err)
}

func (c *Conn) notificationLoop(h Handler, done chan<- struct{}) {
	defer close(done)
	for req := range c.notes {
		if c.ctx.Err() != nil {
			continue // drain
		}
		_, err, panicked := c.call(c.ctx, h, req)
		if panicked {
			c.flushAndClose(ErrHandlerPanic)
			continue
		}
		if err != nil {
			c.log.Debug("notification handler failed", "method", req.Method, "error", err)
		}
	}
}

func (c *Conn) cancelIncoming(params json.RawMessage) {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || !validID(p.RequestID) {
		return
	}
	c.mu.Lock()
	cancel := c.running[string(p.RequestID)]
	c.mu.Unlock()
	if cancel != nil {
		cancel(errPeerCancelled)
	}
}

func (c *Conn) deliverResponse(m *wireMsg) {
	key := string(*m.ID)
	c.mu.Lock()
	ch := c.pending[key]
	delete(c.pending, key)
	c.mu.Unlock()
	if ch == nil {
		c.log.Debug("response to unknown request id dropped")
		return
	}
	ch <- m // buffered
}

func (c *Conn) failPending() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, ch := range c.pending {
		close(ch)
		delete(c.pending, k)
	}
}

// Notify sends a notification. It returns once the message is queued for
// the single writer, so notifications and responses leave in the order
// they were queued.
func (c *Conn) Notify(ctx context.Context, method string, params any) error {
	b, err := json.Marshal(outRequest{JSONRPC: "2.0", Method: method, Params: params})
	if err != nil {
		return fmt.Errorf("acp: marshal %s: %w", method, err)
	}
	return c.enqueue(ctx, b)
}

// Call sends a request to the peer and waits for its response, decoding the
// result into result (which may be nil). When ctx ends first, the peer is
// told with $/cancel_request.
func (c *Conn) Call(ctx context.Context, method string, params, result any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, c.opts.CallTimeout)
		defer cancel()
	}
	id := json.RawMessage(strconv.FormatInt(c.nextID.Add(1), 10))
	b, err := json.Marshal(outRequest{JSONRPC: "2.0", ID: id, Method: method, Params: params})
	if err != nil {
		return fmt.Errorf("acp: marshal %s: %w", method, err)
	}
	ch := make(chan *wireMsg, 1)
	c.mu.Lock()
	if c.ctx.Err() != nil {
		c.mu.Unlock()
		return ErrClosed
	}
	c.pending[string(id)] = ch
	c.mu.Unlock()
	forget := func() {
		c.mu.Lock()
		delete(c.pending, string(id))
		c.mu.Unlock()
	}
	if err := c.enqueue(ctx, b); err != nil {
		forget()
		return err
	}
	select {
	case m, ok := <-ch:
		if !ok {
			return ErrClosed
		}
		if m.Error != nil {
			return m.Error
		}
		if result != nil {
			if err := json.Unmarshal(m.Result, result); err != nil {
				return fmt.Errorf("acp: decode %s result: %w", method, err)
			}
		}
		return nil
	case <-ctx.Done():
		forget()
		_ = c.Notify(context.WithoutCancel(ctx), cancelRequestMethod, map[string]any{"requestId": id})
		return context.Cause(ctx)
	case <-c.ctx.Done():
		return ErrClosed
	}
}

func (c *Conn) sendResponse(id json.RawMessage, result any, e *Error) {
	if id == nil {
		return // notifications are never answered
	}
	if e == nil && result == nil {
		result = struct{}{}
	}
	b, err := json.Marshal(outResponse{JSONRPC: "2.0", ID: id, Result: result, Error: e})
	if err != nil {
		c.log.Error("marshal response", "error", err)
		b, _ = json.Marshal(outResponse{JSONRPC: "2.0", ID: id, Error: Errorf(CodeInternalError, "internal error: unencodable result")})
	}
	_ = c.enqueue(context.Background(), b)
}

func (c *Conn) enqueue(ctx context.Context, b []byte) error {
	if c.ctx.Err() != nil {
		return ErrClosed
	}
	select {
	case c.outbox <- outMsg{b: b}:
		return nil
	case <-c.ctx.Done():
		return ErrClosed
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (c *Conn) writeLoop() {
	defer close(c.writerDone)
	for {
		select {
		case m := <-c.outbox:
			if m.closeCause != nil {
				c.CloseWithCause(m.closeCause)
				return
			}
			ctx, cancel := context.WithTimeout(c.ctx, c.opts.WriteTimeout)
			err := c.t.Write(ctx, m.b)
			cancel()
			if err != nil {
				if c.ctx.Err() == nil {
					c.log.Warn("write failed; dropping connection", "error", err)
					c.CloseWithCause(fmt.Errorf("%w: %w", ErrWriteFailed, err))
				}
				return
			}
		case <-c.ctx.Done():
			return
		}
	}
}
