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
}

// Manager is the lifecycle owner. Create with New; end with Shutdown.
type Manager struct {
	opts Options
	log  *slog.Logger

	mu       sync.Mutex
	runtimes map[string]*runtime // live runtimes by session id
	clients  map[string]*Client  // connections by id
	closing  bool                // Shutdown started: no new connections or runtimes

	shutdownWG sync.WaitGroup

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
		opts:     opts,
		log:      opts.Logger,
		runtimes: make(map[string]*runtime),
		clients:  make(map[string]*Client),
		ended:    make(map[Reason]*atomic.Int64),
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

// end runs the six steps of the design for rt.
func (m *Manager) end(rt *runtime, reason Reason) {
	// 1. Mark closing; only the first caller proceeds, the rest wait.
	rt.mu.Lock()
	if rt.closing {
		rt.mu.Unlock()
		<-rt.ended
		return
	}
	rt.closing = true
	p := rt.prompt
	rt.mu.Unlock()
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

	// 5. Leave every index.
	m.mu.Lock()
	if m.runtimes[rt.id] == rt {
		delete(m.runtimes, rt.id)
	}
	if rt.client.sessions[rt.id] == rt {
		delete(rt.client.sessions, rt.id)
	}
	m.mu.Unlock()

	// 6. Count and log once.
	m.ended[reason].Add(1)
	m.log.Info("session ended", "session_id", rt.id, "connection_id", rt.client.id,
		"reason", string(reason), "took", time.Since(start).Round(time.Microsecond))
	close(rt.ended)
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
		id: id, client: c, cwd: cwd, servers: servers, mcp: mcpSess,
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
			m.runtimes[id] = rt
			c.sessions[id] = rt
			m.mu.Unlock()
			return rt, fails, nil
		}
		m.mu.Unlock()
		// A concurrent load/resume won the race: it is superseded by us.
		m.end(old, ReasonSuperseded)
	}
}

func (m *Manager) checkOpen(c *Client) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.closing || c.closed {
		return errClosing(c)
	}
	return nil
}

func errClosing(c *Client) error {
	if c.closed {
		return acp.Errorf(acp.CodeServerError, "connection is closing")
	}
	return acp.Errorf(acp.CodeServerError, "server is shutting down")
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
