package bridge

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"sort"
	"strconv"
	"sync"
	"time"

	"github.com/coder/websocket"

	"github.com/acpserver/acpserver/acp"
)

// link is one live WebSocket to the server. Its reader, writer and pinger
// goroutines report to the loop through linkCh and are joined by close.
type link struct {
	gen    int
	ws     *websocket.Conn
	outbox chan []byte
	ctx    context.Context // reads, writes and pings; cancelled last
	cancel context.CancelCauseFunc
	quit   chan struct{} // closed first: stop reporting to the loop
	wg     sync.WaitGroup
	once   sync.Once
}

var errLinkClosed = errors.New("bridge: link closed")

func startLink(gen int, ws *websocket.Conn, b *bridge) *link {
	ctx, cancel := context.WithCancelCause(context.Background())
	l := &link{gen: gen, ws: ws, outbox: make(chan []byte, 256), ctx: ctx, cancel: cancel, quit: make(chan struct{})}
	report := func(ev linkEvent) bool {
		select {
		case b.linkCh <- ev:
			return true
		case <-l.quit:
			return false
		}
	}
	down := func(err error) {
		// Only the first failure is reported; the loop then closes us.
		l.once.Do(func() { report(linkEvent{gen: gen, down: err}) })
	}
	l.wg.Go(func() {
		for {
			typ, msg, err := ws.Read(ctx)
			if err != nil {
				down(err)
				return
			}
			if typ != websocket.MessageText {
				continue
			}
			if !report(linkEvent{gen: gen, msg: msg}) {
				return
			}
		}
	})
	l.wg.Go(func() {
		for {
			select {
			case m := <-l.outbox:
				wctx, cancel := context.WithTimeout(ctx, b.opts.WriteTimeout)
				err := ws.Write(wctx, websocket.MessageText, m)
				cancel()
				if err != nil {
					down(fmt.Errorf("write: %w", err))
					return
				}
			case <-l.quit:
				return
			}
		}
	})
	if b.opts.PingInterval > 0 {
		l.wg.Go(func() {
			t := time.NewTicker(b.opts.PingInterval)
			defer t.Stop()
			for {
				select {
				case <-t.C:
				case <-l.quit:
					return
				}
				pctx, cancel := context.WithTimeout(ctx, b.opts.PingTimeout)
				err := ws.Ping(pctx)
				cancel()
				if err != nil {
					down(fmt.Errorf("keepalive ping: %w", err))
					return
				}
			}
		})
	}
	return l
}

// send queues msg for the writer. A full outbox means the link is not
// draining: it is reported down rather than blocking the loop.
func (l *link) send(msg []byte) {
	select {
	case l.outbox <- msg:
	default:
		l.ws.CloseNow() // the reader fails and reports the link down
	}
}

// close ends the link with a close frame (bounded by the library's own
// close timeout) and joins its goroutines.
// The loop calls it; the goroutines stop reporting first so none blocks on
// the loop meanwhile.
func (l *link) close(code websocket.StatusCode, reason string) {
	close(l.quit)
	if code == websocket.StatusNormalClosure {
		_ = l.ws.Close(code, reason)
	}
	l.cancel(errLinkClosed)
	_ = l.ws.CloseNow()
	l.wg.Wait()
}

// dialResult is what a dialer hands the loop: a connection that has been
// re-initialized and has resumed the sessions (ws nil when stopped).
type dialResult struct {
	ws      *websocket.Conn
	notes   [][]byte // server messages seen during the handshake
	resumed []string
	lost    []string // sessions the server no longer knows
}

func (b *bridge) startDialer() {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	b.dialing, b.dialerDone = cancel, done
	var init json.RawMessage
	if b.initDone {
		init = b.initParams
	}
	sessions := make(map[string]sessionParams, len(b.sessions))
	for id, p := range b.sessions {
		sessions[id] = p
	}
	go func() {
		defer close(done)
		r := b.dial(ctx, init, sessions)
		select {
		case b.connCh <- r:
		case <-ctx.Done():
			if r.ws != nil {
				r.ws.CloseNow()
			}
		}
	}()
}

// dialerJoin waits for the dialer that just reported.
func (b *bridge) dialerJoin() {
	if b.dialing != nil {
		b.dialing()
		<-b.dialerDone
		b.dialing, b.dialerDone = nil, nil
	}
}

func (b *bridge) stopDialer() { b.dialerJoin() }

// dial retries with jittered exponential backoff until a connection is up
// and has replayed the handshake, or ctx ends (then ws is nil).
func (b *bridge) dial(ctx context.Context, init json.RawMessage, sessions map[string]sessionParams) *dialResult {
	delay := b.opts.MinBackoff
	for attempt := 1; ; attempt++ {
		r, err := b.attempt(ctx, init, sessions)
		if err == nil {
			return r
		}
		if ctx.Err() != nil {
			return &dialResult{}
		}
		b.log.Warn("connecting to the agent server failed", "url", b.opts.URL, "attempt", attempt, "retry_in", delay.Round(time.Millisecond), "error", err)
		t := time.NewTimer(delay/2 + rand.N(delay/2+1))
		select {
		case <-t.C:
		case <-ctx.Done():
			t.Stop()
			return &dialResult{}
		}
		delay = min(delay*2, b.opts.MaxBackoff)
	}
}

// attempt is one dial plus the handshake replay.
func (b *bridge) attempt(ctx context.Context, init json.RawMessage, sessions map[string]sessionParams) (_ *dialResult, err error) {
	ctx, cancel := context.WithTimeout(ctx, b.opts.HandshakeTimeout)
	defer cancel()
	header := b.opts.Header.Clone()
	if header == nil {
		header = http.Header{}
	}
	if b.opts.HeaderFunc != nil {
		extra, err := b.opts.HeaderFunc()
		if err != nil {
			return nil, err
		}
		for k, vs := range extra {
			header[k] = vs
		}
	}
	ws, resp, err := websocket.Dial(ctx, b.opts.URL, &websocket.DialOptions{HTTPClient: b.opts.HTTPClient, HTTPHeader: header})
	if err != nil {
		if resp != nil && resp.StatusCode == http.StatusUnauthorized {
			return nil, fmt.Errorf("%w (check the token)", err)
		}
		return nil, err
	}
	ws.SetReadLimit(b.opts.ReadLimit)
	defer func() {
		if err != nil {
			ws.CloseNow()
		}
	}()
	r := &dialResult{ws: ws}
	if init == nil {
		return r, nil // the IDE has not initialized yet: it will
	}
	hs := &handshake{ws: ws, notes: &r.notes}
	if _, err := hs.call(ctx, acp.MethodInitialize, init); err != nil {
		return nil, fmt.Errorf("initialize: %w", err)
	}
	ids := make([]string, 0, len(sessions))
	for id := range sessions {
		ids = append(ids, id)
	}
	sort.Strings(ids)
	for _, id := range ids {
		p := sessions[id]
		params, _ := json.Marshal(map[string]any{"sessionId": id, "cwd": p.Cwd, "mcpServers": p.McpServers})
		rpcErr, err := hs.call(ctx, acp.MethodSessionResume, params)
		switch {
		case err != nil:
			return nil, fmt.Errorf("session/resume: %w", err)
		case rpcErr != nil:
			b.log.Warn("session could not be resumed; the IDE's next request for it will fail", "session_id", id, "error", rpcErr.Message)
			r.lost = append(r.lost, id)
		default:
			r.resumed = append(r.resumed, id)
		}
	}
	return r, nil
}

// handshake runs the bridge's own requests on a fresh connection before it
// carries IDE traffic. Its ids cannot collide with the IDE's: no IDE
// request is in flight on a new connection yet.
type handshake struct {
	ws    *websocket.Conn
	next  int
	notes *[][]byte
}

func (h *handshake) call(ctx context.Context, method string, params json.RawMessage) (*acp.Error, error) {
	h.next++
	id := json.RawMessage(strconv.Quote("acpserver-bridge-" + strconv.Itoa(h.next)))
	msg, _ := json.Marshal(map[string]any{"jsonrpc": "2.0", "id": id, "method": method, "params": params})
	if err := h.ws.Write(ctx, websocket.MessageText, msg); err != nil {
		return nil, err
	}
	for {
		typ, m, err := h.ws.Read(ctx)
		if err != nil {
			return nil, err
		}
		if typ != websocket.MessageText {
			continue
		}
		var e envelope
		if json.Unmarshal(m, &e) == nil && e.isResponse() && string(e.ID) == string(id) {
			return e.Error, nil
		}
		// A session/update (e.g. an MCP server that failed to start):
		// the IDE sees it once the link is installed.
		*h.notes = append(*h.notes, m)
	}
}
