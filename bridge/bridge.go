// Package bridge relays ACP between an IDE on stdio and a remote acpserver
// over WebSocket, and survives the loss of the network link.
//
// While the link is up every message passes through unchanged. When it
// drops, the bridge answers the IDE's in-flight requests with an error (a
// running prompt never hangs), tells the IDE to drop the server's pending
// requests, reconnects with backoff, sends the IDE's initialize again (its
// result is swallowed: the IDE never sees a second one) and session/resumes
// every session the IDE has open with the cwd and mcpServers it last gave.
// Requests the IDE sends during the outage wait a bounded time for the link.
//
// All state lives in one event loop goroutine; the IDE reader, the link's
// reader, writer and pinger, and the reconnecting dialer are owned by Run
// and joined before it returns.
package bridge

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/acpserver/acpserver/acp"
)

// Error codes the bridge answers the IDE with.
const (
	// CodeLinkLost: the request was sent but the link dropped before its
	// answer; its outcome on the server is unknown.
	CodeLinkLost = -32001
	// CodeUnavailable: the link stayed down longer than OutageWait; the
	// request was never sent.
	CodeUnavailable = -32003
)

// Options configure Run; zero values mean defaults.
type Options struct {
	// URL is the server's ws:// or wss:// /acp endpoint. Required.
	URL string
	// Header is sent on every upgrade request (e.g. Authorization).
	Header http.Header
	// HeaderFunc, when set, is called before every dial and its headers are
	// added to Header (a token file re-read on each reconnect).
	HeaderFunc func() (http.Header, error)
	// HTTPClient dials the WebSocket (TLS settings live in its Transport).
	// Default http.DefaultClient.
	HTTPClient *http.Client
	// Logger receives the bridge's logs; nil discards.
	Logger *slog.Logger
	// OutageWait bounds how long an IDE request waits for the link to come
	// back before it fails. Default 30s.
	OutageWait time.Duration
	// MinBackoff and MaxBackoff bound the delay between reconnect attempts.
	// Defaults 100ms and 5s.
	MinBackoff, MaxBackoff time.Duration
	// HandshakeTimeout bounds a dial plus the re-initialize and resumes.
	// Default 30s.
	HandshakeTimeout time.Duration
	// PingInterval and PingTimeout detect a silently dead link. Defaults
	// 15s and 10s; a negative interval disables pings.
	PingInterval, PingTimeout time.Duration
	// WriteTimeout bounds one write to the server. Default 10s.
	WriteTimeout time.Duration
	// ReadLimit is the largest message accepted from the server. Default
	// 64 MiB.
	ReadLimit int64
}

func (o *Options) defaults() {
	if o.HTTPClient == nil {
		o.HTTPClient = http.DefaultClient
	}
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.OutageWait <= 0 {
		o.OutageWait = 30 * time.Second
	}
	if o.MinBackoff <= 0 {
		o.MinBackoff = 100 * time.Millisecond
	}
	if o.MaxBackoff < o.MinBackoff {
		o.MaxBackoff = max(5*time.Second, o.MinBackoff)
	}
	if o.HandshakeTimeout <= 0 {
		o.HandshakeTimeout = 30 * time.Second
	}
	if o.PingInterval == 0 {
		o.PingInterval = 15 * time.Second
	}
	if o.PingTimeout <= 0 {
		o.PingTimeout = 10 * time.Second
	}
	if o.WriteTimeout <= 0 {
		o.WriteTimeout = 10 * time.Second
	}
	if o.ReadLimit <= 0 {
		o.ReadLimit = 64 << 20
	}
}

// Run relays between ide and the server until the IDE closes its side
// (io.EOF from ide.Read) or ctx ends. It then closes the WebSocket with a
// normal close, joins every goroutine and returns nil; an IDE read error
// other than EOF is returned.
func Run(ctx context.Context, ide acp.Transport, opts *Options) error {
	var o Options
	if opts != nil {
		o = *opts
	}
	if o.URL == "" {
		return errors.New("bridge: no server URL")
	}
	o.defaults()
	b := &bridge{
		opts:      o,
		log:       o.Logger,
		ide:       ide,
		ideCh:     make(chan []byte),
		linkCh:    make(chan linkEvent),
		connCh:    make(chan *dialResult),
		sessions:  make(map[string]sessionParams),
		inflight:  make(map[string]*ideRequest),
		serverReq: make(map[string]struct{}),
	}
	return b.run(ctx)
}

// sessionParams is what the IDE last gave for an open session.
type sessionParams struct {
	Cwd        string          `json:"cwd"`
	McpServers json.RawMessage `json:"mcpServers"`
}

// ideRequest is a request from the IDE: sent (in flight) or waiting for
// the link.
type ideRequest struct {
	id       json.RawMessage
	method   string
	params   json.RawMessage
	raw      []byte
	deadline time.Time // waiting only
}

// envelope is the part of a JSON-RPC message the bridge looks at; the
// message itself is relayed as received.
type envelope struct {
	ID     json.RawMessage `json:"id,omitempty"`
	Method string          `json:"method,omitempty"`
	Params json.RawMessage `json:"params,omitempty"`
	Result json.RawMessage `json:"result,omitempty"`
	Error  *acp.Error      `json:"error,omitempty"`
}

func (e *envelope) isRequest() bool      { return e.Method != "" && len(e.ID) > 0 }
func (e *envelope) isNotification() bool { return e.Method != "" && len(e.ID) == 0 }
func (e *envelope) isResponse() bool     { return e.Method == "" && len(e.ID) > 0 }

type linkEvent struct {
	gen  int
	msg  []byte
	down error // set when the link ended
}

type bridge struct {
	opts Options
	log  *slog.Logger
	ide  acp.Transport

	ideCh  chan []byte
	ideErr error // valid once ideCh is closed
	linkCh chan linkEvent
	connCh chan *dialResult

	// Owned by the loop goroutine.
	link       *link // nil while down
	gen        int
	dialing    context.CancelFunc // non-nil while a dialer runs
	dialerDone chan struct{}
	initParams json.RawMessage // the IDE's initialize params
	initDone   bool            // the IDE has its initialize result
	sessions   map[string]sessionParams
	inflight   map[string]*ideRequest // sent to the server, by raw id
	waiting    []*ideRequest          // IDE messages held during an outage
	serverReq  map[string]struct{}    // server requests the IDE has not answered
	downSince  time.Time
	attempts   int
}

func (b *bridge) run(ctx context.Context) error {
	readCtx, stopRead := context.WithCancel(context.Background())
	var readerWG sync.WaitGroup
	readerWG.Go(func() { b.readIDE(readCtx) })

	b.startDialer()
	timer := time.NewTimer(time.Hour)
	timer.Stop()
	defer timer.Stop()

	var err error
loop:
	for {
		b.armTimer(timer)
		select {
		case m, ok := <-b.ideCh:
			if !ok {
				if !errors.Is(b.ideErr, io.EOF) && !errors.Is(b.ideErr, acp.ErrClosed) {
					err = fmt.Errorf("bridge: read from IDE: %w", b.ideErr)
				}
				b.log.Info("IDE closed its side; closing the link")
				break loop
			}
			b.fromIDE(m)
		case ev := <-b.linkCh:
			b.fromLink(ev)
		case r := <-b.connCh:
			b.connected(r)
		case <-timer.C:
			b.expireWaiting(time.Now())
		case <-ctx.Done():
			b.log.Info("bridge stopping", "cause", context.Cause(ctx))
			break loop
		}
	}

	// Teardown: stop dialing, close the link normally, stop reading the
	// IDE, join everything.
	b.stopDialer()
	if b.link != nil {
		b.link.close(websocket.StatusNormalClosure, "")
		b.link = nil
	}
	stopRead()
	b.ide.Close()
	readerWG.Wait()
	return err
}

// readIDE forwards the IDE's messages to the loop; ideCh closes on the
// first read error.
func (b *bridge) readIDE(ctx context.Context) {
	defer close(b.ideCh)
	for {
		m, err := b.ide.Read(ctx)
		if err != nil {
			b.ideErr = err
			return
		}
		select {
		case b.ideCh <- m:
		case <-ctx.Done():
			b.ideErr = ctx.Err()
			return
		}
	}
}

func (b *bridge) writeIDE(msg []byte) {
	ctx, cancel := context.WithTimeout(context.Background(), b.opts.WriteTimeout)
	defer cancel()
	if err := b.ide.Write(ctx, msg); err != nil {
		b.log.Warn("write to IDE failed", "error", err)
	}
}

func (b *bridge) answerIDE(id json.RawMessage, code int, msg string) {
	out, _ := json.Marshal(struct {
		JSONRPC string          `json:"jsonrpc"`
		ID      json.RawMessage `json:"id"`
		Error   *acp.Error      `json:"error"`
	}{"2.0", id, &acp.Error{Code: code, Message: msg}})
	b.writeIDE(out)
}

// fromIDE handles one IDE message.
func (b *bridge) fromIDE(m []byte) {
	var e envelope
	if json.Unmarshal(m, &e) != nil {
		// Not ours to judge: the server answers malformed input.
		b.sendOrHold(&ideRequest{raw: m})
		return
	}
	switch {
	case e.isRequest():
		if e.Method == acp.MethodInitialize {
			b.initParams = append(json.RawMessage(nil), e.Params...)
		}
		b.sendOrHold(&ideRequest{id: e.ID, method: e.Method, params: e.Params, raw: m})
	case e.isNotification():
		if e.Method == "$/cancel_request" && b.cancelWaiting(e.Params) {
			return
		}
		if b.link == nil && e.Method == acp.MethodSessionCancel {
			return // its prompt was already failed at the link loss
		}
		b.sendOrHold(&ideRequest{method: e.Method, raw: m})
	case e.isResponse():
		key := string(e.ID)
		if _, ok := b.serverReq[key]; !ok || b.link == nil {
			b.log.Debug("IDE response to a request of a lost link dropped")
			return
		}
		delete(b.serverReq, key)
		b.link.send(m)
	default:
		b.sendOrHold(&ideRequest{raw: m})
	}
}

// sendOrHold sends an IDE message now, or holds it until the link is back.
func (b *bridge) sendOrHold(r *ideRequest) {
	if b.link == nil || len(b.waiting) > 0 {
		r.deadline = time.Now().Add(b.opts.OutageWait)
		b.waiting = append(b.waiting, r)
		return
	}
	b.send(r)
}

func (b *bridge) send(r *ideRequest) {
	if r.id != nil {
		b.inflight[string(r.id)] = r
	}
	b.link.send(r.raw)
}

// cancelWaiting answers a held request the IDE cancelled.
func (b *bridge) cancelWaiting(params json.RawMessage) bool {
	var p struct {
		RequestID json.RawMessage `json:"requestId"`
	}
	if json.Unmarshal(params, &p) != nil || len(p.RequestID) == 0 {
		return false
	}
	for i, r := range b.waiting {
		if r.id != nil && bytes.Equal(r.id, p.RequestID) {
			b.waiting = append(b.waiting[:i], b.waiting[i+1:]...)
			b.answerIDE(r.id, acp.CodeCancelled, "request cancelled")
			return true
		}
	}
	return false
}

func (b *bridge) armTimer(t *time.Timer) {
	t.Stop()
	if len(b.waiting) == 0 {
		return
	}
	next := b.waiting[0].deadline
	for _, r := range b.waiting[1:] {
		if r.deadline.Before(next) {
			next = r.deadline
		}
	}
	t.Reset(max(time.Until(next), 0))
}

// expireWaiting fails the held requests whose wait is over; expired
// notifications are dropped.
func (b *bridge) expireWaiting(now time.Time) {
	kept := b.waiting[:0]
	for _, r := range b.waiting {
		if now.Before(r.deadline) {
			kept = append(kept, r)
			continue
		}
		if r.id != nil {
			b.log.Warn("request failed: agent server unreachable", "method", r.method, "waited", b.opts.OutageWait)
			b.answerIDE(r.id, CodeUnavailable, fmt.Sprintf(
				"acpserver bridge: the agent server has been unreachable for %s; %s was not sent (the bridge keeps reconnecting)",
				b.opts.OutageWait, methodOr(r.method)))
		}
	}
	clear(b.waiting[len(kept):])
	b.waiting = kept
}

func methodOr(m string) string {
	if m == "" {
		return "the request"
	}
	return m
}

// fromLink handles a message from, or the end of, the current link.
func (b *bridge) fromLink(ev linkEvent) {
	if b.link == nil || ev.gen != b.gen {
		return // a stale event of a closed link
	}
	if ev.down != nil {
		b.linkLost(ev.down)
		return
	}
	var e envelope
	if json.Unmarshal(ev.msg, &e) != nil {
		b.writeIDE(ev.msg)
		return
	}
	switch {
	case e.isResponse():
		if r := b.inflight[string(e.ID)]; r != nil {
			delete(b.inflight, string(e.ID))
			b.learn(r, &e)
		}
	case e.isRequest():
		b.serverReq[string(e.ID)] = struct{}{}
	}
	b.writeIDE(ev.msg)
}

// learn updates the session table from the answer to an IDE request.
func (b *bridge) learn(r *ideRequest, e *envelope) {
	switch r.method {
	case acp.MethodInitialize:
		if e.Error == nil {
			b.initDone = true
		}
	case acp.MethodSessionNew:
		var res struct {
			SessionID string `json:"sessionId"`
		}
		if e.Error == nil && json.Unmarshal(e.Result, &res) == nil && res.SessionID != "" {
			b.sessions[res.SessionID] = paramsOf(r.params)
		}
	case acp.MethodSessionLoad, acp.MethodSessionResume:
		var p struct {
			SessionID string `json:"sessionId"`
		}
		if e.Error == nil && json.Unmarshal(r.params, &p) == nil && p.SessionID != "" {
			b.sessions[p.SessionID] = paramsOf(r.params)
		}
	case acp.MethodSessionClose, acp.MethodSessionDelete:
		var p struct {
			SessionID string `json:"sessionId"`
		}
		if json.Unmarshal(r.params, &p) == nil && (e.Error == nil || e.Error.Code == acp.CodeNotFound) {
			delete(b.sessions, p.SessionID)
		}
	}
}

func paramsOf(params json.RawMessage) sessionParams {
	var p sessionParams
	_ = json.Unmarshal(params, &p)
	if len(p.McpServers) == 0 || string(p.McpServers) == "null" {
		p.McpServers = json.RawMessage("[]")
	}
	return p
}

// linkLost fails everything that depended on the dead link and starts
// reconnecting.
func (b *bridge) linkLost(cause error) {
	b.log.Warn("link to the agent server lost; reconnecting", "error", cause,
		"open_sessions", len(b.sessions), "failed_requests", len(b.inflight))
	b.link.close(websocket.StatusGoingAway, "")
	b.link = nil
	b.downSince = time.Now()
	for key, r := range b.inflight {
		delete(b.inflight, key)
		msg := fmt.Sprintf("acpserver bridge: the connection to the agent server was lost while %s was in flight; its outcome is unknown. The bridge is reconnecting and resuming the session: send it again.", methodOr(r.method))
		if r.method == acp.MethodSessionPrompt {
			msg = "acpserver bridge: the connection to the agent server was lost during this prompt turn; the turn did not finish. The bridge is reconnecting and resuming the session: send the prompt again."
		}
		b.answerIDE(r.id, CodeLinkLost, msg)
	}
	// The server's pending requests (permission prompts) died with it.
	for key := range b.serverReq {
		delete(b.serverReq, key)
		note, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "method": "$/cancel_request",
			"params": map[string]json.RawMessage{"requestId": json.RawMessage(key)}})
		b.writeIDE(note)
	}
	b.startDialer()
}

// connected installs a link the dialer brought up, or notes a failure.
func (b *bridge) connected(r *dialResult) {
	b.dialerJoin()
	if r.ws == nil {
		return // the dialer was stopped
	}
	b.gen++
	b.link = startLink(b.gen, r.ws, b)
	for _, id := range r.lost {
		delete(b.sessions, id)
	}
	if b.downSince.IsZero() {
		b.log.Info("connected to the agent server", "url", b.opts.URL)
	} else {
		b.log.Info("reconnected to the agent server", "url", b.opts.URL,
			"outage", time.Since(b.downSince).Round(time.Millisecond), "resumed_sessions", len(r.resumed))
	}
	for _, n := range r.notes {
		b.writeIDE(n)
	}
	held := b.waiting
	b.waiting = nil
	for _, h := range held {
		b.send(h)
	}
}
