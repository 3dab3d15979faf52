package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/sessionmgr"
	"github.com/acpserver/acpserver/wsconn"
)

// version is set at build time with -ldflags "-X main.version=...".
var version = "dev"

type serveConfig struct {
	listen           string
	logFormat        string
	logLevel         slog.Level
	readLimit        int64
	pingInterval     time.Duration
	pingTimeout      time.Duration
	writeTimeout     time.Duration
	handshakeTimeout time.Duration
	shutdownTimeout  time.Duration
	endTimeout       time.Duration
	maxInFlight      int
	allowedOrigins   stringList
	mcp              mcpFlags
	agent            agentFlags
	limits           limitFlags
	dataDir          string
}

// stringList is a repeatable, comma-separated flag.
type stringList []string

func (s *stringList) String() string { return fmt.Sprint([]string(*s)) }
func (s *stringList) Set(v string) error {
	for _, p := range strings.Split(v, ",") {
		if p = strings.TrimSpace(p); p != "" {
			*s = append(*s, p)
		}
	}
	return nil
}

// parseServeFlags parses the flags shared by the server and stdio mode
// (which ignores the WebSocket-only ones); name titles the usage text.
func parseServeFlags(name string, args []string, stderr io.Writer) (*serveConfig, error) {
	c := &serveConfig{}
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&c.listen, "listen", "127.0.0.1:8765", "address to serve on (host:port)")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text (colored on a terminal) or json")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
	fs.Int64Var(&c.readLimit, "read-limit", 4<<20, "largest accepted WebSocket message in bytes; larger closes with 1009")
	fs.DurationVar(&c.pingInterval, "ping-interval", 30*time.Second, "keepalive ping interval (0 disables)")
	fs.DurationVar(&c.pingTimeout, "ping-timeout", 15*time.Second, "a ping unanswered this long drops the connection")
	fs.DurationVar(&c.writeTimeout, "write-timeout", 10*time.Second, "a peer that does not read for this long is dropped")
	fs.DurationVar(&c.handshakeTimeout, "handshake-timeout", 30*time.Second, "time allowed between the upgrade and initialize")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "deadline for ending every session on SIGINT/SIGTERM")
	fs.DurationVar(&c.endTimeout, "end-timeout", 5*time.Second, "how long ending a session waits for its running prompt")
	fs.IntVar(&c.maxInFlight, "max-inflight", 64, "requests in flight per connection; past it requests are refused")
	fs.Var(&c.allowedOrigins, "allowed-origins", "comma-separated Origin host patterns allowed to connect (default: loopback only; no Origin header is always allowed)")
	registerMCPFlags(fs, &c.mcp)
	registerAgentFlags(fs, &c.agent)
	registerLimitFlags(fs, &c.limits)
	fs.StringVar(&c.dataDir, "data-dir", "", "directory where session records and history persist across restarts (empty: in memory, lost at exit)")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := bindEnv(fs); err != nil {
		return nil, err
	}
	if c.mcp.configPath != "" {
		if err := applyModelConfig(fs, c.mcp.configPath); err != nil {
			return nil, err
		}
	}
	if err := c.mcp.validate(); err != nil {
		return nil, err
	}
	if err := c.agent.validate(); err != nil {
		return nil, err
	}
	if err := c.limits.load(); err != nil {
		return nil, err
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return nil, fmt.Errorf("--log-format must be text or json, got %q", c.logFormat)
	}
	for name, d := range map[string]time.Duration{
		"ping-timeout": c.pingTimeout, "write-timeout": c.writeTimeout, "handshake-timeout": c.handshakeTimeout,
		"shutdown-timeout": c.shutdownTimeout, "end-timeout": c.endTimeout,
	} {
		if d <= 0 {
			return nil, fmt.Errorf("--%s (%s) must be positive, got %s", name, envName(name), d)
		}
	}
	if c.pingInterval < 0 {
		return nil, fmt.Errorf("--ping-interval (%s) must not be negative", envName("ping-interval"))
	}
	if c.readLimit <= 0 {
		return nil, fmt.Errorf("--read-limit (%s) must be positive", envName("read-limit"))
	}
	if c.maxInFlight <= 0 {
		return nil, fmt.Errorf("--max-inflight (%s) must be positive", envName("max-inflight"))
	}
	return c, nil
}

// serve runs the server until ctx ends, then shuts down within the
// configured deadline.
func serve(ctx context.Context, cfg *serveConfig, log *slog.Logger) error {
	core, err := newCore(ctx, cfg, log, isLoopbackListen(cfg.listen))
	if err != nil {
		return err
	}
	defer core.close(log) // after every session has ended
	mgr := core.mgr
	pingInterval := cfg.pingInterval
	if pingInterval == 0 {
		pingInterval = -1
	}
	var origins []string
	if len(cfg.allowedOrigins) > 0 {
		origins = cfg.allowedOrigins
	}
	ws := wsconn.New(wsconn.Options{
		Logger: log,
		Connect: func(id string, conn *acp.Conn) (acp.Handler, func(), error) {
			c, err := mgr.Connect(id, conn)
			if err != nil {
				return nil, nil, err
			}
			return c, c.Disconnect, nil
		},
		ReadLimit:        cfg.readLimit,
		PingInterval:     pingInterval,
		PingTimeout:      cfg.pingTimeout,
		WriteTimeout:     cfg.writeTimeout,
		HandshakeTimeout: cfg.handshakeTimeout,
		MaxInFlight:      cfg.maxInFlight,
		OriginPatterns:   origins,
		AuthToken:        cfg.limits.authToken,
		MaxConnections:   cfg.limits.maxConnections,
	})

	mux := http.NewServeMux()
	mux.Handle("GET /acp", ws)
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		io.WriteString(w, "ok\n")
	})
	mux.HandleFunc("GET /debug/sessions", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		json.NewEncoder(w).Encode(mgr.Snapshot())
	})

	ln, err := net.Listen("tcp", cfg.listen)
	if err != nil {
		return fmt.Errorf("listen on %s: %w", cfg.listen, err)
	}
	srv := &http.Server{
		Handler:           mux,
		ReadHeaderTimeout: 10 * time.Second,
		ErrorLog:          slog.NewLogLogger(log.Handler(), slog.LevelWarn),
	}
	log.Info("listening", "addr", ln.Addr().String(), "version", version)
	cfg.limits.warnIfExposed(log, ln.Addr())

	serveErr := make(chan error, 1)
	go func() { serveErr <- srv.Serve(ln) }()

	var failed error
	select {
	case err := <-serveErr:
		failed = fmt.Errorf("serve: %w", err) // still end every session below
		serveErr <- nil
	case <-ctx.Done():
	}

	log.Info("shutting down", "deadline", cfg.shutdownTimeout)
	start := time.Now()
	sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	// Stop accepting while the sessions end: http.Server.Shutdown neither
	// closes nor waits for hijacked WebSocket connections, so the session
	// manager and the WebSocket handler end those themselves.
	var wg sync.WaitGroup
	wg.Go(func() { _ = srv.Shutdown(sctx) })
	mgrErr := core.shutdown(sctx)
	wsErr := ws.Shutdown(sctx)
	wg.Wait()
	_ = srv.Close()
	<-serveErr
	if err := errors.Join(mgrErr, wsErr); err != nil {
		log.Warn("shutdown deadline passed with work still ending", "error", err, "took", time.Since(start))
		return failed
	}
	if failed != nil {
		return failed
	}
	snap := mgr.Snapshot()
	log.Info("shutdown complete", "took", time.Since(start).Round(time.Millisecond), "ended_shutdown", snap.Ended[sessionmgr.ReasonShutdown])
	return nil
}
