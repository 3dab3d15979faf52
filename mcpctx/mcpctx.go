// Package mcpctx owns one session's MCP context: the clients for the
// session's mcpServers, its toolset cache and its in-flight tool calls, all
// released by Close. It also holds the process-wide pool of globally
// configured servers.
//
// Nothing here is keyed by a session id in a process-wide map: a Session
// value is the context, and a load or resume of the same id gets a new one
// (the old one is closed first by the session manager).
//
// Lock order: Session.mu before upstream.mu. No lock is held while talking
// to an upstream.
package mcpctx

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// ServerConfig is one MCP server to connect to. Kind is "stdio", "http" or
// "sse".
type ServerConfig struct {
	Name    string
	Kind    string
	Command string
	Args    []string
	Env     map[string]string
	URL     string
	Headers map[string]string
}

// Counters are the process-wide gauges shown by /debug/sessions. They
// count per-session resources only; the global pool's clients are not in
// them.
type Counters struct {
	Clients       atomic.Int64
	Toolsets      atomic.Int64
	InflightCalls atomic.Int64
}

// StdioPolicy decides whether a session may start a stdio server: a
// client asking for one runs a command on this host.
type StdioPolicy struct {
	// Allow permits stdio servers; the zero policy refuses them.
	Allow bool
	// Commands, when not empty, restricts the commands to these (matched
	// against the command as given or its base name).
	Commands []string
	// Refusal explains a refusal to the client (e.g. which flag enables
	// stdio servers).
	Refusal string
}

func (p StdioPolicy) check(cfg ServerConfig) error {
	if !p.Allow {
		msg := "stdio MCP servers are not allowed on this server"
		if p.Refusal != "" {
			msg += ": " + p.Refusal
		}
		return errors.New(msg)
	}
	if len(p.Commands) > 0 && !slices.Contains(p.Commands, cfg.Command) && !slices.Contains(p.Commands, filepath.Base(cfg.Command)) {
		return fmt.Errorf("stdio MCP server command %q is not in the allow-list (--stdio-mcp-allow)", filepath.Base(cfg.Command))
	}
	return nil
}

// Options configure Open; nil means defaults.
type Options struct {
	Logger       *slog.Logger
	Counters     *Counters
	CloseTimeout time.Duration // bound on closing one client; default 5s
	StartTimeout time.Duration // bound on starting one client; default 10s
	// Stdio decides about stdio servers asked for by clients; the zero
	// value refuses them.
	Stdio StdioPolicy
	// Pool holds the global servers whose tools every session sees.
	Pool *Pool
	// ClientVersion is sent to upstream servers in initialize.
	ClientVersion string
}

func (o *Options) closeTimeout() time.Duration {
	if o == nil || o.CloseTimeout <= 0 {
		return defaultCloseTimeout
	}
	return o.CloseTimeout
}

func (o *Options) startTimeout() time.Duration {
	if o == nil || o.StartTimeout <= 0 {
		return defaultStartTimeout
	}
	return o.StartTimeout
}

func (o *Options) logger() *slog.Logger {
	if o == nil || o.Logger == nil {
		return discard
	}
	return o.Logger
}

// Failure is a server that could not be started for a session.
type Failure struct {
	Server string
	Err    error
}

// Tool is one callable tool, named SERVER/TOOL.
type Tool struct {
	Name        string
	Server      string
	Description string
	InputSchema json.RawMessage
}

// Result is a finished tool call; Content holds MCP content blocks as JSON
// (their shapes match ACP content blocks).
type Result struct {
	Content []json.RawMessage
	IsError bool
}

// Session is one runtime's MCP context. Its methods are safe for
// concurrent use; Close may race with Call and cancels it.
type Session struct {
	id       string
	opts     Options
	log      *slog.Logger
	counters *Counters

	// life ends when Close starts; every call runs under it.
	life       context.Context
	cancelLife context.CancelCauseFunc

	mu     sync.Mutex
	ups    map[string]*upstream // by server name; the session's toolset cache lives in them
	order  []string
	closed bool
	calls  sync.WaitGroup
	done   chan struct{} // closed when Close has finished
}

// ErrSessionClosed is the cause of calls cancelled by Close.
var ErrSessionClosed = errors.New("MCP session closed")

// Open connects to every server in parallel; a server that fails is
// reported and left out, never half-started.
func Open(ctx context.Context, sessionID string, servers []ServerConfig, opts *Options) (*Session, []Failure) {
	s := &Session{id: sessionID, ups: make(map[string]*upstream), done: make(chan struct{})}
	if opts != nil {
		s.opts = *opts
	}
	s.log = s.opts.logger()
	s.counters = s.opts.Counters
	if s.counters == nil {
		s.counters = new(Counters)
	}
	s.life, s.cancelLife = context.WithCancelCause(context.Background())
	s.counters.Toolsets.Add(1)

	var (
		fails []Failure
		mu    sync.Mutex
		wg    sync.WaitGroup
		seen  = make(map[string]bool)
	)
	fail := func(name string, err error) {
		mu.Lock()
		fails = append(fails, Failure{Server: name, Err: err})
		mu.Unlock()
	}
	for _, sc := range servers {
		switch {
		case seen[sc.Name]:
			fail(sc.Name, errors.New("another server of this session has the same name"))
			continue
		case strings.Contains(sc.Name, "/"):
			fail(sc.Name, errors.New("server names must not contain '/'"))
			continue
		}
		seen[sc.Name] = true
		if sc.Kind == "stdio" {
			if err := s.opts.Stdio.check(sc); err != nil {
				fail(sc.Name, err)
				continue
			}
		}
		s.order = append(s.order, sc.Name)
		wg.Go(func() {
			u, err := dial(ctx, sc, &s.opts, s.log.With("session_id", sessionID))
			if err != nil {
				fail(sc.Name, err)
				return
			}
			s.counters.Clients.Add(1)
			mu.Lock()
			s.ups[sc.Name] = u
			mu.Unlock()
		})
	}
	wg.Wait()
	s.order = slices.DeleteFunc(s.order, func(n string) bool { return s.ups[n] == nil })
	for _, u := range s.ups {
		u.startRefresher(nil)
	}
	// Report failures in the order the servers were given.
	slices.SortStableFunc(fails, func(a, b Failure) int {
		return slices.IndexFunc(servers, func(c ServerConfig) bool { return c.Name == a.Server }) -
			slices.IndexFunc(servers, func(c ServerConfig) bool { return c.Name == b.Server })
	})
	return s, fails
}

// Tools is the session's current toolset: its own servers' tools, then
// the global servers' tools (a session server shadows a global one of the
// same name).
func (s *Session) Tools() []Tool {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return nil
	}
	ups := make([]*upstream, 0, len(s.order))
	for _, n := range s.order {
		ups = append(ups, s.ups[n])
	}
	s.mu.Unlock()
	var out []Tool
	for _, u := range ups {
		out = appendTools(out, u)
	}
	if s.opts.Pool != nil {
		for _, u := range s.opts.Pool.upstreams() {
			if !slices.Contains(s.order, u.cfg.Name) {
				out = appendTools(out, u)
			}
		}
	}
	return out
}

func appendTools(out []Tool, u *upstream) []Tool {
	for _, t := range u.toolList() {
		var schema json.RawMessage
		if len(t.RawInputSchema) > 0 {
			schema = t.RawInputSchema
		} else if b, err := json.Marshal(t.InputSchema); err == nil {
			schema = b
		}
		out = append(out, Tool{Name: u.cfg.Name + "/" + t.Name, Server: u.cfg.Name, Description: t.Description, InputSchema: schema})
	}
	return out
}

// Call runs one tool by its SERVER/TOOL name. The call is counted in
// flight, and cancelled by ctx or by Close, which joins it.
func (s *Session) Call(ctx context.Context, name string, args json.RawMessage) (Result, error) {
	server, tool, ok := strings.Cut(name, "/")
	if !ok || server == "" || tool == "" {
		return Result{}, fmt.Errorf("tool names are SERVER/TOOL, got %q", name)
	}
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		return Result{}, ErrSessionClosed
	}
	u := s.ups[server]
	s.calls.Add(1)
	s.mu.Unlock()
	defer s.calls.Done()
	if u == nil && s.opts.Pool != nil {
		u = s.opts.Pool.upstream(server)
	}
	if u == nil {
		return Result{}, fmt.Errorf("unknown MCP server %q in tool %q", server, name)
	}
	if !slices.ContainsFunc(u.toolList(), func(t mcpTool) bool { return t.Name == tool }) {
		return Result{}, fmt.Errorf("MCP server %q has no tool %q", server, tool)
	}

	s.counters.InflightCalls.Add(1)
	defer s.counters.InflightCalls.Add(-1)
	cctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	stop := context.AfterFunc(s.life, func() { cancel(context.Cause(s.life)) })
	defer stop()

	res, err := u.call(cctx, tool, args)
	if err != nil {
		if cctx.Err() != nil {
			return Result{}, fmt.Errorf("tool call %s cancelled: %w", name, context.Cause(cctx))
		}
		return Result{}, fmt.Errorf("tool call %s failed: %w", name, err)
	}
	out := Result{IsError: res.IsError}
	for _, c := range res.Content {
		if b, err := json.Marshal(c); err == nil {
			out.Content = append(out.Content, b)
		}
	}
	return out, nil
}

// Close cancels and joins in-flight calls, then closes every client in
// parallel, each bounded by the close timeout, and drops the toolset.
// Failures are logged at warning and never stop the release. Idempotent;
// a second caller waits for the first.
func (s *Session) Close(ctx context.Context) {
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		<-s.done
		return
	}
	s.closed = true
	ups := s.ups
	s.ups = nil
	s.order = nil
	s.mu.Unlock()
	defer close(s.done)

	s.cancelLife(ErrSessionClosed)
	d := s.opts.closeTimeout()
	joined := make(chan struct{})
	go func() { s.calls.Wait(); close(joined) }()
	t := time.NewTimer(d)
	select {
	case <-joined:
	case <-t.C:
		s.log.Warn("MCP tool calls did not stop in time; closing their clients", "session_id", s.id, "timeout", d)
	}
	t.Stop()

	var wg sync.WaitGroup
	for name, u := range ups {
		wg.Go(func() {
			start := time.Now()
			if err := u.close(d); err != nil {
				s.log.Warn("MCP client close failed", "session_id", s.id, "server", name, "error", err)
			} else {
				s.log.Debug("MCP client closed", "session_id", s.id, "server", name, "took", time.Since(start).Round(time.Microsecond))
			}
			s.counters.Clients.Add(-1)
		})
	}
	wg.Wait()
	<-joined // the clients are closed, so no call can still be waiting on one
	s.counters.Toolsets.Add(-1)
}
