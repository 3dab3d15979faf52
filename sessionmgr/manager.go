// Package sessionmgr owns session lifecycles: the ACP method handlers, the
// registry of live runtimes, the connection -> sessions reverse index and
// EndSession, the single path by which a runtime ends.
//
// Lock order: Manager.mu before runtime.mu. Neither is held while calling
// out (MCP, store, the peer, the agent).
package sessionmgr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/agent"
	"github.com/acpserver/acpserver/mcpctx"
	"github.com/acpserver/acpserver/store"
)

// Reason says why a runtime ended.
type Reason string

// The reasons a runtime ends, as counted in /debug/sessions.
const (
	ReasonClosed       Reason = "closed"
	ReasonDisconnected Reason = "disconnected"
	ReasonSuperseded   Reason = "superseded"
	ReasonIdle         Reason = "idle"
	ReasonDeleted      Reason = "deleted"
	ReasonShutdown     Reason = "shutdown"
)

var allReasons = []Reason{ReasonClosed, ReasonDisconnected, ReasonSuperseded, ReasonIdle, ReasonDeleted, ReasonShutdown}

// Peer is the part of an ACP connection the manager talks back through.
type Peer interface {
	Notify(ctx context.Context, method string, params any) error
	Call(ctx context.Context, method string, params, result any) error
}

// Options configure a Manager; zero values mean defaults.
type Options struct {
	Logger *slog.Logger
	Store  store.Store // default: in memory
	Agent  agent.Agent // default: the built-in agent
	// EndTimeout bounds how long EndSession waits for a running prompt to
	// finish after cancelling it. Default 5s.
	EndTimeout time.Duration
	// MCP is passed to mcpctx.Open for every runtime; its Counters are
	// replaced by the manager's.
	MCP mcpctx.Options
	// AgentInfo is reported by initialize.
	AgentName, AgentVersion string

	// IdleTTL ends a runtime nobody has used for this long (reason idle);
	// its record and history stay. 0 disables eviction.
	IdleTTL time.Duration
	// MaxSessions bounds live runtimes in total, MaxSessionsPerConn per
	// connection; past either, session/new, load and resume are refused
	// with a server error. 0 means no limit.
	MaxSessions, MaxSessionsPerConn int
}

// Manager is the lifecycle owner. Create with New; end with Shutdown.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	runtimes map[string]*runtime // live runtimes by session id
	clients  map[string]*Client  // connections by id
	// evictedBy maps a session whose runtime ended idle to the connection
	// that may rebuild it (see Client.evicted).
	evictedBy map[string]*Client
	closing   bool // Shutdown started: no new connections or runtimes

	shutdownWG sync.WaitGroup
	attached   int64 // runtimes ever registered; each must end exactly once

	mcpCounters     mcpctx.Counters
	inflightPrompts atomic.Int64
	ended           map[Reason]*atomic.Int64
}

// New builds a Manager.
func New(opts Options) *Manager {
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.Store == nil {
		opts.Store = store.NewMemory()
	}
	if opts.Agent == nil {
		opts.Agent = &agent.Builtin{}
	}
	if opts.EndTimeout <= 0 {
		opts.EndTimeout = 5 * time.Second
	}
	if opts.AgentName == "" {
		opts.AgentName = "acpserver"
	}
	m := &Manager{
		opts:      opts,
		log:       opts.Logger,
		runtimes:  make(map[string]*runtime),
		clients:   make(map[string]*Client),
		evictedBy: make(map[string]*Client),
		ended:     make(map[Reason]*atomic.Int64),
	}
	m.opts.MCP.Counters = &m.mcpCounters
	if m.opts.MCP.Logger == nil {
		m.opts.MCP.Logger = opts.Logger
	}
	for _, r := range allReasons {
		m.ended[r] = new(atomic.Int64)
	}
	return m
}

// Snapshot is the counts-only view served at /debug/sessions. It never
// holds ids, arguments or secrets.
type Snapshot struct {
	Connections       int              `json:"connections"`
	Sessions          int              `json:"sessions"`
	MCPClients        int64            `json:"mcp_clients"`
	Toolsets          int64            `json:"toolsets"`
	InflightPrompts   int64            `json:"inflight_prompts"`
	InflightToolCalls int64            `json:"inflight_tool_calls"`
	Ended             map[Reason]int64 `json:"ended"`
}

// Snapshot returns the current counts.
func (m *Manager) Snapshot() Snapshot {
	m.mu.Lock()
	s := Snapshot{Connections: len(m.clients), Sessions: len(m.runtimes)}
	m.mu.Unlock()
	s.MCPClients = m.mcpCounters.Clients.Load()
	s.Toolsets = m.mcpCounters.Toolsets.Load()
	s.InflightPrompts = m.inflightPrompts.Load()
	s.InflightToolCalls = m.mcpCounters.InflightCalls.Load()
	s.Ended = make(map[Reason]int64, len(allReasons))
	for _, r := range allReasons {
		s.Ended[r] = m.ended[r].Load()
	}
	return s
}

// runtime is one live session runtime, attached to exactly one connection.
type runtime struct {
	id      string
	client  *Client
	cwd     string
	servers []acp.McpServer
	mcp     *mcpctx.Session
	agent   *agent.SessionState // per-runtime agent memory ("allow always")

	mu       sync.Mutex
	closing  bool       // step 1 of EndSession: refuse new work
	prompt   *promptRun // the running turn, if any
	lastUsed time.Time

	ended chan struct{} // closed when EndSession has finished
}

type promptRun struct {
	cancel context.CancelCauseFunc
	done   chan struct{}
}

// errSessionEnded is the cancel cause of a prompt whose runtime ended.
var errSessionEnded = errors.New("session runtime ended")

// EndSession ends the live runtime of id, if any, for reason. It is the
// only way a runtime ends; it is idempotent and safe to race with itself and
// with in-flight work. It returns once the runtime is fully released (also
// when another caller is ending it).
func (m *Manager) EndSession(id string, reason Reason) {
	m.mu.Lock()
	rt := m.runtimes[id]
	m.mu.Unlock()
	if rt != nil {
		m.end(rt, reason)
	}
}

// end runs the six steps of the design for rt. A caller that loses the
// race to claim rt waits until the winner has finished.
func (m *Manager) end(rt *runtime, reason Reason) {
	rt.mu.Lock()
	if rt.closing {
		rt.mu.Unlock()
		<-rt.ended
		return
	}
	rt.closing = true // 1. refuse new work; nothing can re-attach
	p := rt.prompt
	rt.mu.Unlock()
	m.finish(rt, reason, p)
}

// finish runs steps 2 to 6 for a runtime its caller has claimed (set
// closing under rt.mu), with the prompt that was running at the claim.
func (m *Manager) finish(rt *runtime, reason Reason, p *promptRun) {
	start := time.Now()

	// 2. Cancel the running prompt (its tool calls run under its context)
	// and join it, bounded.
	if p != nil {
		p.cancel(errSessionEnded)
		t := time.NewTimer(m.opts.EndTimeout)
		select {
		case <-p.done:
		case <-t.C:
			m.log.Warn("prompt did not stop in time; releasing its session anyway",
				"session_id", rt.id, "reason", string(reason), "timeout", m.opts.EndTimeout)
		}
		t.Stop()
	}

	// 3 and 4. Close every MCP client (in parallel, each bounded, outside
	// any lock) and drop the toolset; mcpctx logs failures per server.
	if rt.mcp != nil {
		rt.mcp.Close(context.Background())
	}

	// 5. Leave every index. An idle runtime leaves its parameters with the
	// connection so the next prompt there can rebuild it.
	m.mu.Lock()
	if m.runtimes[rt.id] == rt {
		delete(m.runtimes, rt.id)
	}
	if rt.client.sessions[rt.id] == rt {
		delete(rt.client.sessions, rt.id)
		if reason == ReasonIdle && !rt.client.closed {
			m.setEvicted(rt.client, rt.id, evictedParams{cwd: rt.cwd, servers: rt.servers})
		}
	}
	m.mu.Unlock()

	// 6. Count and log once.
	m.ended[reason].Add(1)
	m.log.Info("session ended", "session_id", rt.id, "connection_id", rt.client.id,
		"reason", string(reason), "took", time.Since(start).Round(time.Microsecond))
	close(rt.ended)
}

// maxEvictedPerConn bounds the rebuild rights one connection keeps when
// sessions are unlimited.
const maxEvictedPerConn = 1000

// setEvicted lets c rebuild id on its next prompt. m.mu is held. The rights
// a connection keeps are bounded like its live sessions; past the bound an
// arbitrary older right is dropped (that session then needs a load).
func (m *Manager) setEvicted(c *Client, id string, p evictedParams) {
	m.clearEvicted(id)
	limit := m.opts.MaxSessionsPerConn
	if limit <= 0 {
		limit = maxEvictedPerConn
	}
	for old := range c.evicted {
		if len(c.evicted) < limit {
			break
		}
		m.clearEvicted(old)
	}
	c.evicted[id] = p
	m.evictedBy[id] = c
}

// clearEvicted forgets id's rebuild rights, wherever they are: a load,
// resume or delete from anywhere supersedes them. m.mu is held.
func (m *Manager) clearEvicted(id string) {
	if o := m.evictedBy[id]; o != nil {
		delete(o.evicted, id)
		delete(m.evictedBy, id)
	}
}

// Sweep ends, with reason idle, every runtime unused since now-IdleTTL
// that has no prompt (and so no tool call) running. It returns how many it
// ended. The sweeper calls it on a timer; tests call it with any now.
func (m *Manager) Sweep(now time.Time) int {
	if m.opts.IdleTTL <= 0 {
		return 0
	}
	m.mu.Lock()
	rts := make([]*runtime, 0, len(m.runtimes))
	for _, rt := range m.runtimes {
		rts = append(rts, rt)
	}
	m.mu.Unlock()
	var wg sync.WaitGroup
	n := 0
	for _, rt := range rts {
		rt.mu.Lock()
		idle := !rt.closing && rt.prompt == nil && now.Sub(rt.lastUsed) >= m.opts.IdleTTL
		if idle {
			rt.closing = true // claimed atomically with the idle check
		}
		rt.mu.Unlock()
		if idle {
			wg.Go(func() { m.finish(rt, ReasonIdle, nil) })
			n++
		}
	}
	wg.Wait() // each end is bounded; in parallel they take as long as one
	return n
}

// RunSweeper calls Sweep every TTL/4 (at least every second) until ctx
// ends. The caller owns the goroutine that runs it.
func (m *Manager) RunSweeper(ctx context.Context) {
	if m.opts.IdleTTL <= 0 {
		return
	}
	every := max(m.opts.IdleTTL/4, time.Second)
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			if n := m.Sweep(now); n > 0 {
				m.log.Debug("idle sweep", "ended", n)
			}
		}
	}
}

// attach builds a fresh runtime for a session on client and registers it,
// first ending any live runtime of the same id (close-then-recreate; never
// reuse). It returns an error if the manager or connection is closing.
func (m *Manager) attach(ctx context.Context, c *Client, id, cwd string, servers []acp.McpServer) (*runtime, []mcpctx.Failure, error) {
	// End whatever runs under this id now, wherever it lives.
	m.EndSession(id, ReasonSuperseded)

	if err := m.checkOpen(c); err != nil {
		return nil, nil, err
	}
	mcpSess, fails := mcpctx.Open(ctx, id, toServerConfigs(servers), &m.opts.MCP)
	rt := &runtime{
		id: id, client: c, cwd: cwd, servers: servers, mcp: mcpSess, agent: &agent.SessionState{},
		lastUsed: time.Now(), ended: make(chan struct{}),
	}
	for {
		m.mu.Lock()
		if m.closing || c.closed {
			m.mu.Unlock()
			mcpSess.Close(context.Background())
			return nil, nil, errClosing(c)
		}
		old := m.runtimes[id]
		if old == nil {
			if err := m.checkLimits(c); err != nil {
				m.mu.Unlock()
				mcpSess.Close(context.Background())
				return nil, nil, err
			}
			m.clearEvicted(id)
			m.runtimes[id] = rt
			c.sessions[id] = rt
			m.attached++
			m.mu.Unlock()
			// A delete that ran since the caller checked the record has
			// either ended rt already or left no record: re-check.
			if _, err := m.opts.Store.Get(context.WithoutCancel(ctx), id); errors.Is(err, store.ErrNotFound) {
				m.end(rt, ReasonDeleted)
				return nil, nil, &acp.Error{Code: acp.CodeNotFound, Message: fmt.Sprintf("session %q was deleted", truncate(id, 64))}
			}
			return rt, fails, nil
		}
		m.mu.Unlock()
		// A concurrent load/resume won the race: it is superseded by us.
		m.end(old, ReasonSuperseded)
	}
}

// checkLimits refuses a new runtime past the configured limits. m.mu is
// held.
func (m *Manager) checkLimits(c *Client) error {
	if n := m.opts.MaxSessions; n > 0 && len(m.runtimes) >= n {
		return acp.Errorf(acp.CodeRetryLater, "session limit reached: %d live sessions on this server; close one and retry", n)
	}
	if n := m.opts.MaxSessionsPerConn; n > 0 && len(c.sessions) >= n {
		return acp.Errorf(acp.CodeRetryLater, "session limit reached: %d live sessions on this connection; close one and retry", n)
	}
	return nil
}

func (m *Manager) checkOpen(c *Client) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing || c.closed {
		return errClosing(c)
	}
	return m.checkLimits(c)
}

func errClosing(c *Client) error {
	if c.closed {
		return acp.Errorf(acp.CodeRetryLater, "connection is closing")
	}
	return acp.Errorf(acp.CodeRetryLater, "server is shutting down")
}

// Shutdown refuses new connections and runtimes, then ends every live
// runtime with reason shutdown, in parallel. It returns when all have ended
// or ctx expires.
func (m *Manager) Shutdown(ctx context.Context) error {
	m.mu.Lock()
	m.closing = true
	rts := make([]*runtime, 0, len(m.runtimes))
	for _, rt := range m.runtimes {
		rts = append(rts, rt)
	}
	m.mu.Unlock()

	var wg sync.WaitGroup
	for _, rt := range rts {
		wg.Go(func() { m.end(rt, ReasonShutdown) })
	}
	done := make(chan struct{})
	m.shutdownWG.Go(func() { wg.Wait(); close(done) })
	select {
	case <-done:
		return nil
	case <-ctx.Done():
		// The ends still running are bounded by EndTimeout and the MCP close
		// timeout; Wait joins them.
		return ctx.Err()
	}
}

// Wait joins the work Shutdown started, including ends that outlived its
// deadline.
func (m *Manager) Wait() { m.shutdownWG.Wait() }

// Info is the initialize result this server gives.
func (m *Manager) initializeResult() acp.InitializeResponse {
	return acp.InitializeResponse{
		ProtocolVersion: acp.ProtocolVersion,
		AgentCapabilities: acp.AgentCapabilities{
			LoadSession:        true,
			PromptCapabilities: acp.PromptCapabilities{EmbeddedContext: true},
			McpCapabilities:    acp.McpCapabilities{HTTP: true, SSE: true},
			SessionCapabilities: acp.SessionCapabilities{
				List: &acp.Empty{}, Delete: &acp.Empty{}, Resume: &acp.Empty{}, Close: &acp.Empty{},
			},
		},
		AgentInfo:   &acp.Implementation{Name: m.opts.AgentName, Version: m.opts.AgentVersion},
		AuthMethods: []json.RawMessage{},
	}
}

func toServerConfigs(servers []acp.McpServer) []mcpctx.ServerConfig {
	out := make([]mcpctx.ServerConfig, 0, len(servers))
	for _, s := range servers {
		sc := mcpctx.ServerConfig{Name: s.Name, Kind: s.Kind(), Command: s.Command, Args: s.Args, URL: s.URL}
		if len(s.Env) > 0 {
			sc.Env = make(map[string]string, len(s.Env))
			for _, e := range s.Env {
				sc.Env[e.Name] = e.Value
			}
		}
		if len(s.Headers) > 0 {
			sc.Headers = make(map[string]string, len(s.Headers))
			for _, h := range s.Headers {
				sc.Headers[h.Name] = h.Value
			}
		}
		out = append(out, sc)
	}
	return out
}
