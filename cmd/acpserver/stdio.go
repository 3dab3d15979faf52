package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"time"

	"github.com/google/uuid"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/sessionmgr"
)

type stdioConfig struct {
	logFormat       string
	logLevel        slog.Level
	maxLine         int
	writeTimeout    time.Duration
	shutdownTimeout time.Duration
	endTimeout      time.Duration
	maxInFlight     int
}

func parseStdioFlags(args []string, stderr io.Writer) (*stdioConfig, error) {
	c := &stdioConfig{}
	fs := flag.NewFlagSet("acpserver stdio", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, "usage: acpserver stdio [flags]\n\nServes one ACP connection over stdin/stdout (newline-delimited JSON-RPC).\nLogs go to stderr. Flags:")
		fs.PrintDefaults()
	}
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json (always on stderr)")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
	fs.IntVar(&c.maxLine, "read-limit", acp.DefaultMaxLineBytes, "longest accepted stdin line (one message) in bytes; longer ends the connection")
	fs.DurationVar(&c.writeTimeout, "write-timeout", 10*time.Second, "bound on writing one message to stdout")
	fs.DurationVar(&c.shutdownTimeout, "shutdown-timeout", 10*time.Second, "deadline for ending every session at exit")
	fs.DurationVar(&c.endTimeout, "end-timeout", 5*time.Second, "how long ending a session waits for its running prompt")
	fs.IntVar(&c.maxInFlight, "max-inflight", 64, "requests in flight; past it requests are refused")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		return nil, fmt.Errorf("unexpected arguments: %v", fs.Args())
	}
	if err := bindEnv(fs); err != nil {
		return nil, err
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return nil, fmt.Errorf("--log-format must be text or json, got %q", c.logFormat)
	}
	for name, d := range map[string]time.Duration{
		"write-timeout": c.writeTimeout, "shutdown-timeout": c.shutdownTimeout, "end-timeout": c.endTimeout,
	} {
		if d <= 0 {
			return nil, fmt.Errorf("--%s (%s) must be positive, got %s", name, envName(name), d)
		}
	}
	if c.maxLine <= 0 {
		return nil, fmt.Errorf("--read-limit (%s) must be positive", envName("read-limit"))
	}
	if c.maxInFlight <= 0 {
		return nil, fmt.Errorf("--max-inflight (%s) must be positive", envName("max-inflight"))
	}
	return c, nil
}

// runStdio is the stdio subcommand: exit code 0 on a clean end (stdin EOF
// or a signal), 2 on bad flags, 1 when the connection failed.
func runStdio(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, err := parseStdioFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "acpserver stdio: %v\n", err)
		return 2
	}
	log := newLogger(stderr, cfg.logFormat, cfg.logLevel)
	if err := serveStdio(ctx, cfg, stdin, stdout, log); err != nil {
		log.Error("stdio connection failed", "error", err)
		return 1
	}
	return 0
}

// serveStdio serves one ACP connection on stdin/stdout with the same peer
// and session manager as a WebSocket connection; the connection's runtimes
// end (reason disconnected) when stdin reaches EOF.
func serveStdio(ctx context.Context, cfg *stdioConfig, stdin io.Reader, stdout io.Writer, log *slog.Logger) error {
	mgr := sessionmgr.New(sessionmgr.Options{
		Logger:       log,
		EndTimeout:   cfg.endTimeout,
		AgentVersion: version,
	})
	id := uuid.NewString()
	clog := log.With("connection_id", id)
	tr := acp.NewStdioTransport(stdin, stdout, &acp.StdioOptions{MaxLineBytes: cfg.maxLine})
	conn := acp.NewConn(tr, &acp.Options{
		Logger:       clog,
		WriteTimeout: cfg.writeTimeout,
		MaxInFlight:  cfg.maxInFlight,
		FirstMethod:  acp.MethodInitialize,
	})
	client, err := mgr.Connect(id, conn)
	if err != nil {
		return err
	}
	clog.Info("stdio connection opened", "version", version)
	cause := func() error {
		// The on-disconnect hook runs on every way out.
		defer client.Disconnect()
		return conn.Serve(ctx, client)
	}()

	sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	if err := mgr.Shutdown(sctx); err != nil {
		log.Warn("shutdown deadline passed with work still ending", "error", err)
	}
	snap := mgr.Snapshot()
	clog.Info("stdio connection closed", "cause", stdioCause(cause), "ended_disconnected", snap.Ended[sessionmgr.ReasonDisconnected])
	switch {
	case cause == nil, errors.Is(cause, io.EOF), errors.Is(cause, acp.ErrClosed), ctx.Err() != nil:
		return nil
	}
	return cause
}

func stdioCause(err error) string {
	if err == nil || errors.Is(err, io.EOF) {
		return "eof"
	}
	return err.Error()
}
