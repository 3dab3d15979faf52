package sessionmgr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/google/uuid"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/agent"
	"github.com/acpserver/acpserver/mcpctx"
	"github.com/acpserver/acpserver/store"
)

// Client is one ACP connection's view of the manager: it serves the
// connection's requests and owns the set of runtimes attached to it.
type Client struct {
	m    *Manager
	id   string
	peer Peer

	// Guarded by m.mu.
	sessions map[string]*runtime
	evicted  map[string]evictedParams // runtimes ended idle, rebuilt on the next prompt
	closed   bool
}

// evictedParams are what a connection last gave for a session whose
// runtime was evicted for idleness.
type evictedParams struct {
	cwd     string
	servers []acp.McpServer
}

// ErrShuttingDown refuses a connection while the manager shuts down.
var ErrShuttingDown = errors.New("sessionmgr: shutting down")

// Connect registers a new connection. The caller must call Disconnect on
// every exit path (a defer).
func (m *Manager) Connect(connID string, peer Peer) (*Client, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing {
		return nil, ErrShuttingDown
	}
	c := &Client{m: m, id: connID, peer: peer, sessions: make(map[string]*runtime), evicted: make(map[string]evictedParams)}
	m.clients[connID] = c
	return c, nil
}

// Disconnect ends every runtime attached to the connection with reason
// disconnected and forgets the connection. Idempotent.
func (c *Client) Disconnect() {
	m := c.m
	m.mu.Lock()
	c.closed = true
	rts := make([]*runtime, 0, len(c.sessions))
	for _, rt := range c.sessions {
		rts = append(rts, rt)
	}
	delete(m.clients, c.id)
	for id := range c.evicted {
		m.clearEvicted(id)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	for _, rt := range rts {
		wg.Go(func() { m.end(rt, ReasonDisconnected) })
	}
	wg.Wait()
}

// Handle dispatches one ACP request or notification.
func (c *Client) Handle(ctx context.Context, req *acp.Request) (any, error) {
	switch req.Method {
	case acp.MethodInitialize:
		return c.initialize(req)
	case acp.MethodSessionNew:
		return c.newSession(ctx, req)
	case acp.MethodSessionLoad:
		return c.loadSession(ctx, req, true)
	case acp.MethodSessionResume:
		return c.loadSession(ctx, req, false)
	case acp.MethodSessionPrompt:
		return c.prompt(ctx, req)
	case acp.MethodSessionCancel:
		return nil, c.cancel(req)
	case acp.MethodSessionClose:
		return c.closeSession(req)
	case acp.MethodSessionList:
		return c.list(ctx, req)
	case acp.MethodSessionDelete:
		return c.deleteSession(ctx, req)
	case acp.MethodAuthenticate:
		return struct{}{}, nil // no auth methods are advertised
	}
	if strings.HasPrefix(req.Method, "_") && req.IsNotification() {
		return nil, nil // extension notifications are ignorable
	}
	return nil, acp.Errorf(acp.CodeMethodNotFound, "method not found: %q", truncate(req.Method, 64))
}

func (c *Client) initialize(req *acp.Request) (any, error) {
	var p acp.InitializeRequest
	if err := acp.DecodeParams(req.Params, &p); err != nil {
		return nil, err
	}
	if p.ProtocolVersion == nil {
		return nil, acp.Errorf(acp.CodeInvalidParams, "invalid params: protocolVersion is required")
	}
	// Per ACP, answer with the version we support; the client decides.
	return c.m.initializeResult(), nil
}

func decodeServers(servers []acp.McpServer) error {
	for _, s := range servers {
		if err := s.Validate(); err != nil {
			return err
		}
	}
	return nil
}

func (c *Client) newSession(ctx context.Context, req *acp.Request) (any, error) {
	var p acp.NewSessionRequest
	if err := acp.DecodeParams(req.Params, &p); err != nil {
		return nil, err
	}
	if err := acp.CheckCwd(p.Cwd); err != nil {
		return nil, err
	}
	if err := decodeServers(p.McpServers); err != nil {
		return nil, err
	}
	if err := c.m.checkOpen(c); err != nil {
		return nil, err
	}
	id := uuid.NewString()
	if err := c.m.opts.Store.Create(ctx, store.Record{ID: id, Cwd: p.Cwd}); err != nil {
		return nil, fmt.Errorf("create session record: %w", err)
	}
	rt, fails, err := c.m.attach(ctx, c, id, p.Cwd, p.McpServers)
	if err != nil {
		_ = c.m.opts.Store.Delete(context.WithoutCancel(ctx), id)
		return nil, err
	}
	c.m.log.Info("session started", "session_id", id, "connection_id", c.id, "mcp_servers", len(p.McpServers))
	// Failed servers are reported after the response, once the client
	// knows the session id.
	return acp.FollowUp{
		Result: acp.NewSessionResponse{SessionID: id},
		Then:   func() { c.reportFailures(rt, fails) },
	}, nil
}

func (c *Client) loadSession(ctx context.Context, req *acp.Request, replay bool) (any, error) {
	var p acp.LoadSessionRequest
	if err := acp.DecodeParams(req.Params, &p); err != nil {
		return nil, err
	}
	if err := acp.CheckSessionID(p.SessionID); err != nil {
		return nil, err
	}
	if err := acp.CheckCwd(p.Cwd); err != nil {
		return nil, err
	}
	if err := decodeServers(p.McpServers); err != nil {
		return nil, err
	}
	if _, err := c.m.opts.Store.Get(ctx, p.SessionID); err != nil {
		return nil, unknownSession(p.SessionID, err)
	}
	rt, fails, err := c.m.attach(ctx, c, p.SessionID, p.Cwd, p.McpServers)
	if err != nil {
		return nil, err
	}
	if replay {
		if err := c.replay(ctx, p.SessionID); err != nil {
			// The client is told the load failed: no runtime may stay.
			c.m.end(rt, ReasonClosed)
			return nil, err
		}
	}
	c.reportFailures(rt, fails)
	verb := "resumed"
	if replay {
		verb = "loaded"
	}
	c.m.log.Info("session "+verb, "session_id", p.SessionID, "connection_id", c.id, "mcp_servers", len(p.McpServers))
	return struct{}{}, nil
}

// replay sends the session's history, in order, as session/update
// notifications.
func (c *Client) replay(ctx context.Context, id string) error {
	hist, err := c.m.opts.Store.History(ctx, id)
	if err != nil {
		return unknownSession(id, err)
	}
	for _, e := range hist {
		if err := c.peer.Notify(ctx, acp.MethodSessionUpdate, acp.SessionNotification{SessionID: id, Update: e}); err != nil {
			return err
		}
	}
	return nil
}

// reportFailures tells the client which MCP servers could not start, as an
// agent message it can show.
func (c *Client) reportFailures(rt *runtime, fails []mcpctx.Failure) {
	for _, f := range fails {
		c.m.log.Warn("MCP server failed to start", "session_id", rt.id, "server", f.Server, "error", f.Err)
		msg := fmt.Sprintf("MCP server %q is unavailable: %v", f.Server, f.Err)
		_ = c.peer.Notify(context.Background(), acp.MethodSessionUpdate,
			acp.SessionNotification{SessionID: rt.id, Update: acp.AgentText(msg)})
	}
}

func unknownSession(id string, err error) error {
	if err == nil || errors.Is(err, store.ErrNotFound) {
		return &acp.Error{Code: acp.CodeNotFound, Message: fmt.Sprintf("unknown session %q", truncate(id, 64))}
	}
	return err
}

// lookup finds the runtime of id attached to this connection and not
// closing.
func (c *Client) lookup(id string) (*runtime, error) {
	if err := acp.CheckSessionID(id); err != nil {
		return nil, err
	}
	c.m.mu.Lock()
	rt := c.sessions[id]
	c.m.mu.Unlock()
	if rt == nil {
		return nil, errNotActive(id)
	}
	rt.mu.Lock()
	rt.lastUsed = time.Now() // any request for the session is activity
	rt.mu.Unlock()
	return rt, nil
}

func errNotActive(id string) error {
	return &acp.Error{Code: acp.CodeNotFound, Message: fmt.Sprintf("session %q is not active on this connection; call session/load or session/resume first", truncate(id, 64))}
}

// lookupOrRebuild is lookup for session/prompt: a runtime evicted for
// idleness (or being evicted right now) is rebuilt transparently from the
// parameters this connection last gave for it.
func (c *Client) lookupOrRebuild(ctx context.Context, id string) (*runtime, error) {
	for range 3 {
		rt, err := c.lookup(id)
		if err == nil {
			rt.mu.Lock()
			closing := rt.closing
			rt.mu.Unlock()
			if !closing {
				return rt, nil
			}
			select { // being ended: see why once it has
			case <-rt.ended:
			case <-ctx.Done():
				return nil, context.Cause(ctx)
			}
			continue
		}
		c.m.mu.Lock()
		p, ok := c.evicted[id]
		c.m.clearEvicted(id)
		c.m.mu.Unlock()
		if !ok {
			return nil, err
		}
		if _, err := c.m.opts.Store.Get(ctx, id); err != nil {
			return nil, unknownSession(id, err)
		}
		rt, fails, err := c.m.attach(ctx, c, id, p.cwd, p.servers)
		if err != nil {
			return nil, err
		}
		c.reportFailures(rt, fails)
		c.m.log.Info("session rebuilt after idle eviction", "session_id", id, "connection_id", c.id)
		return rt, nil
	}
	return nil, errNotActive(id)
}

func (c *Client) prompt(ctx context.Context, req *acp.Request) (any, error) {
	var p acp.PromptRequest
	if err := acp.DecodeParams(req.Params, &p); err != nil {
		return nil, err
	}
	if p.Prompt == nil {
		return nil, acp.Errorf(acp.CodeInvalidParams, "invalid params: prompt is required")
	}
	rt, err := c.lookupOrRebuild(ctx, p.SessionID)
	if err != nil {
		return nil, err
	}
	m := c.m

	pctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	run := &promptRun{cancel: cancel, done: make(chan struct{})}
	rt.mu.Lock()
	switch {
	case rt.closing:
		rt.mu.Unlock()
		return nil, &acp.Error{Code: acp.CodeNotFound, Message: fmt.Sprintf("session %q has ended", truncate(rt.id, 64))}
	case rt.prompt != nil:
		rt.mu.Unlock()
		return nil, acp.Errorf(acp.CodeBusy, "a prompt is already running for session %q; cancel it or wait for its response", truncate(rt.id, 64))
	}
	rt.prompt = run
	rt.lastUsed = time.Now()
	rt.mu.Unlock()
	m.inflightPrompts.Add(1)
	defer func() {
		rt.mu.Lock()
		rt.prompt = nil
		rt.lastUsed = time.Now()
		rt.mu.Unlock()
		m.inflightPrompts.Add(-1)
		close(run.done)
	}()

	st := m.opts.Store
	hist, err := st.History(ctx, rt.id)
	if err != nil {
		return nil, unknownSession(rt.id, err)
	}
	entries := make([]store.Entry, 0, len(p.Prompt))
	for _, b := range p.Prompt {
		e, err := json.Marshal(acp.UserChunk(b))
		if err != nil {
			return nil, acp.Errorf(acp.CodeInvalidParams, "invalid params: prompt block: %v", err)
		}
		entries = append(entries, e)
	}
	if err := st.Append(ctx, rt.id, entries...); err != nil {
		return nil, unknownSession(rt.id, err)
	}
	if len(hist) == 0 {
		c.setTitle(ctx, rt.id, p.Prompt)
	}

	sendCtx := context.WithoutCancel(ctx)
	var updateMu sync.Mutex // history order is send order, whoever calls
	turn := &agent.Turn{
		SessionID: rt.id,
		Prompt:    p.Prompt,
		History:   hist,
		Tools:     toolset{rt.mcp},
		State:     rt.agent,
		Update: func(u any) error {
			updateMu.Lock()
			defer updateMu.Unlock()
			raw, err := json.Marshal(u)
			if err != nil {
				return fmt.Errorf("encode update: %w", err)
			}
			if err := st.Append(sendCtx, rt.id, raw); err != nil && !errors.Is(err, store.ErrNotFound) {
				m.log.Warn("history append failed", "session_id", rt.id, "error", err)
			}
			return c.peer.Notify(sendCtx, acp.MethodSessionUpdate, acp.SessionNotification{SessionID: rt.id, Update: json.RawMessage(raw)})
		},
		RequestPermission: func(ctx context.Context, r acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
			var resp acp.RequestPermissionResponse
			err := c.peer.Call(ctx, acp.MethodRequestPermission, r, &resp)
			return resp, err
		},
	}
	reason, err := m.opts.Agent.Prompt(pctx, turn)
	if ctx.Err() != nil {
		// The request itself was cancelled ($/cancel_request, answered
		// -32800) or the connection is gone.
		return nil, context.Cause(ctx)
	}
	if pctx.Err() != nil {
		// Cancelled by session/cancel or by the runtime ending: the turn
		// reports cancelled, after all its updates.
		return acp.PromptResponse{StopReason: acp.StopCancelled}, nil
	}
	if err != nil {
		m.log.Warn("prompt turn failed", "session_id", rt.id, "error", err)
		return nil, err
	}
	return acp.PromptResponse{StopReason: reason}, nil
}

var errCancelledByClient = errors.New("cancelled by session/cancel")

func (c *Client) cancel(req *acp.Request) error {
	var p acp.SessionIDRequest
	if err := acp.DecodeParams(req.Params, &p); err != nil {
		return err
	}
	rt, err := c.lookup(p.SessionID)
	if err != nil {
		return err
	}
	rt.mu.Lock()
	run := rt.prompt
	rt.mu.Unlock()
	if run != nil {
		run.cancel(errCancelledByClient)
	}
	return nil
}

func (c *Client) setTitle(ctx context.Context, id string, prompt []acp.ContentBlock) {
	for _, b := range prompt {
		if b.Type != "text" || strings.TrimSpace(b.Text) == "" {
			continue
		}
		t := strings.Join(strings.Fields(b.Text), " ")
		if len(t) > 80 {
			t = t[:80]
			for !utf8.ValidString(t) {
				t = t[:len(t)-1]
			}
		}
		_ = c.m.opts.Store.SetTitle(ctx, id, t)
		return
	}
}

func (c *Client) closeSession(req *acp.Request) (any, error) {
	var p acp.SessionIDRequest
	if err := acp.DecodeParams(req.Params, &p); err != nil {
		return nil, err
	}
	rt, err := c.lookup(p.SessionID)
	if err != nil {
		c.m.mu.Lock()
		_, evicted := c.evicted[p.SessionID]
		if evicted {
			c.m.clearEvicted(p.SessionID)
		}
		c.m.mu.Unlock()
		if evicted {
			return struct{}{}, nil // its runtime already ended idle
		}
		return nil, err
	}
	c.m.end(rt, ReasonClosed)
	return struct{}{}, nil
}

func (c *Client) deleteSession(ctx context.Context, req *acp.Request) (any, error) {
	var p acp.SessionIDRequest
	if err := acp.DecodeParams(req.Params, &p); err != nil {
		return nil, err
	}
	if err := acp.CheckSessionID(p.SessionID); err != nil {
		return nil, err
	}
	if _, err := c.m.opts.Store.Get(ctx, p.SessionID); err != nil {
		return nil, unknownSession(p.SessionID, err)
	}
	// Record first: a load or rebuild that has not checked it yet fails,
	// and one that has re-checks it after attaching (see attach).
	if err := c.m.opts.Store.Delete(ctx, p.SessionID); err != nil {
		return nil, unknownSession(p.SessionID, err)
	}
	c.m.EndSession(p.SessionID, ReasonDeleted)
	c.m.mu.Lock()
	c.m.clearEvicted(p.SessionID)
	c.m.mu.Unlock()
	c.m.log.Info("session deleted", "session_id", p.SessionID, "connection_id", c.id)
	return struct{}{}, nil
}

func (c *Client) list(ctx context.Context, req *acp.Request) (any, error) {
	var p acp.ListSessionsRequest
	if len(req.Params) > 0 && string(req.Params) != "null" {
		if err := acp.DecodeParams(req.Params, &p); err != nil {
			return nil, err
		}
	}
	opts := store.ListOptions{}
	if p.Cwd != nil {
		opts.Cwd = *p.Cwd
	}
	if p.Cursor != nil {
		opts.Cursor = *p.Cursor
	}
	recs, next, err := c.m.opts.Store.List(ctx, opts)
	if err != nil {
		return nil, acp.Errorf(acp.CodeInvalidParams, "invalid params: %v", err)
	}
	resp := acp.ListSessionsResponse{Sessions: make([]acp.SessionInfo, 0, len(recs))}
	for _, r := range recs {
		info := acp.SessionInfo{SessionID: r.ID, Cwd: r.Cwd, UpdatedAt: r.UpdatedAt.UTC().Format(time.RFC3339Nano)}
		if r.Title != "" {
			title := r.Title
			info.Title = &title
		}
		resp.Sessions = append(resp.Sessions, info)
	}
	if next != "" {
		resp.NextCursor = &next
	}
	return resp, nil
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	s = s[:n]
	for !utf8.ValidString(s) {
		s = s[:len(s)-1]
	}
	return s + "…"
}
