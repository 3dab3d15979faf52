package main

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sort"
	"time"

	"github.com/acpserver/acpserver/mcpctx"
)

// mcpFlags are the MCP settings: the config file of global servers, the
// client bounds and the stdio policy.
type mcpFlags struct {
	configPath   string
	closeTimeout time.Duration
	startTimeout time.Duration
	allowStdio   bool
	stdioAllow   stringList
}

func registerMCPFlags(fs *flag.FlagSet, f *mcpFlags) {
	fs.StringVar(&f.configPath, "config", "", `JSON config file with global MCP servers: {"mcpServers": {"NAME": {"command","args","env"} | {"type","url","headers"}}}`)
	fs.DurationVar(&f.closeTimeout, "mcp-close-timeout", 5*time.Second, "bound on closing one MCP client (DELETE, or stdin close/SIGTERM/SIGKILL)")
	fs.DurationVar(&f.startTimeout, "mcp-start-timeout", 10*time.Second, "bound on starting and initializing one MCP client")
	fs.BoolVar(&f.allowStdio, "allow-stdio-mcp", false, "let clients start stdio MCP servers (commands on this host) even when listening beyond loopback")
	fs.Var(&f.stdioAllow, "stdio-mcp-allow", "comma-separated commands clients may start as stdio MCP servers (default: any, when stdio servers are allowed)")
}

func (f *mcpFlags) validate() error {
	for name, d := range map[string]time.Duration{"mcp-close-timeout": f.closeTimeout, "mcp-start-timeout": f.startTimeout} {
		if d <= 0 {
			return fmt.Errorf("--%s (%s) must be positive, got %s", name, envName(name), d)
		}
	}
	return nil
}

// stdioPolicy: a client's stdio server runs a command on this host. It is
// allowed when the server listens on loopback only (the client is on this
// host already), or when --allow-stdio-mcp says so; --stdio-mcp-allow
// narrows either case to a list of commands.
func (f *mcpFlags) stdioPolicy(localClient bool) mcpctx.StdioPolicy {
	p := mcpctx.StdioPolicy{Allow: f.allowStdio || localClient, Commands: f.stdioAllow}
	if !p.Allow {
		p.Refusal = "this server listens beyond loopback; its operator can allow them with --allow-stdio-mcp"
	}
	return p
}

// isLoopbackListen reports whether addr (host:port) binds loopback only.
func isLoopbackListen(addr string) bool {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return false
	}
	if host == "localhost" {
		return true
	}
	ip := net.ParseIP(host)
	return ip != nil && ip.IsLoopback()
}

// fileConfig is the config file, in the shape MCP hosts already use.
type fileConfig struct {
	MCPServers map[string]fileServer `json:"mcpServers"`
}

type fileServer struct {
	Type    string            `json:"type"`
	Command string            `json:"command"`
	Args    []string          `json:"args"`
	Env     map[string]string `json:"env"`
	URL     string            `json:"url"`
	Headers map[string]string `json:"headers"`
}

// loadConfig reads the global MCP servers of path, sorted by name.
func loadConfig(path string) ([]mcpctx.ServerConfig, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read config: %w", err)
	}
	var fc fileConfig
	dec := json.NewDecoder(bytes.NewReader(b))
	if err := dec.Decode(&fc); err != nil {
		return nil, fmt.Errorf("config %s: %w", path, err)
	}
	names := make([]string, 0, len(fc.MCPServers))
	for n := range fc.MCPServers {
		names = append(names, n)
	}
	sort.Strings(names)
	out := make([]mcpctx.ServerConfig, 0, len(names))
	for _, n := range names {
		s := fc.MCPServers[n]
		sc := mcpctx.ServerConfig{Name: n, Command: s.Command, Args: s.Args, Env: s.Env, URL: s.URL, Headers: s.Headers}
		switch s.Type {
		case "", "stdio":
			sc.Kind = "stdio"
			if s.Command == "" {
				if s.URL != "" {
					sc.Kind = "http" // a url without a type: streamable HTTP
					break
				}
				return nil, fmt.Errorf("config %s: MCP server %q needs a command or a url", path, n)
			}
		case "http", "streamable-http", "streamableHttp", "streamable_http":
			sc.Kind = "http"
		case "sse":
			sc.Kind = "sse"
		default:
			return nil, fmt.Errorf("config %s: MCP server %q has unknown type %q (stdio, http or sse)", path, n, s.Type)
		}
		if sc.Kind != "stdio" && s.URL == "" {
			return nil, fmt.Errorf("config %s: MCP server %q needs a url", path, n)
		}
		if n == "" || bytes.ContainsRune([]byte(n), '/') {
			return nil, fmt.Errorf("config %s: MCP server name %q must be non-empty and without '/'", path, n)
		}
		out = append(out, sc)
	}
	return out, nil
}

// startMCP loads the config file, starts the global pool and returns the
// options every session's MCP context gets. A global server that fails to
// start is logged and left out; a bad config file fails the boot.
func startMCP(ctx context.Context, cfg *serveConfig, log *slog.Logger, localClient bool) (*mcpctx.Pool, mcpctx.Options, error) {
	f := &cfg.mcp
	opts := mcpctx.Options{
		Logger:        log,
		CloseTimeout:  f.closeTimeout,
		StartTimeout:  f.startTimeout,
		Stdio:         f.stdioPolicy(localClient),
		ClientVersion: version,
	}
	if !opts.Stdio.Allow {
		log.Info("stdio MCP servers from clients are refused (listening beyond loopback without --allow-stdio-mcp)")
	}
	if f.configPath == "" {
		return nil, opts, nil
	}
	servers, err := loadConfig(f.configPath)
	if err != nil {
		return nil, opts, err
	}
	start := time.Now()
	pool, fails := mcpctx.NewPool(ctx, servers, &opts)
	for _, fl := range fails {
		log.Warn("global MCP server failed to start", "server", fl.Server, "error", fl.Err)
	}
	log.Info("global MCP servers started", "started", pool.Len(), "failed", len(fails), "took", time.Since(start).Round(time.Millisecond))
	opts.Pool = pool
	return pool, opts, nil
}
