// Package mcpctx owns one session's MCP context: the clients for the
// session's mcpServers, its toolset cache and its in-flight tool calls, all
// released by Close. It also holds the process-wide pool of globally
// configured servers.
package mcpctx

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
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

// Counters are the process-wide gauges shown by /debug/sessions.
type Counters struct {
	Clients       atomic.Int64
	Toolsets      atomic.Int64
	InflightCalls atomic.Int64
}

// Options configure Open; nil means defaults.
type Options struct {
	Logger       *slog.Logger
	Counters     *Counters
	CloseTimeout time.Duration // bound on closing one client; default 5s
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

// Session is one runtime's MCP context.
type Session struct {
	id   string
	opts Options
}

// Open connects to every server; a server that fails is reported and left
// out, never half-started.
func Open(ctx context.Context, sessionID string, servers []ServerConfig, opts *Options) (*Session, []Failure) {
	s := &Session{id: sessionID}
	if opts != nil {
		s.opts = *opts
	}
	var fails []Failure
	for _, sc := range servers {
		fails = append(fails, Failure{Server: sc.Name, Err: errors.New("MCP servers are not supported yet")})
	}
	return s, fails
}

// Tools is the session's current toolset.
func (s *Session) Tools() []Tool { return nil }

// Call runs one tool by its SERVER/TOOL name.
func (s *Session) Call(ctx context.Context, name string, args json.RawMessage) (Result, error) {
	return Result{}, errors.New("unknown tool " + name)
}

// Close cancels and joins in-flight calls, then closes every client.
func (s *Session) Close(ctx context.Context) {}
