package main

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"sync"

	"github.com/google/uuid"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/sessionmgr"
)

// runStdio is the stdio subcommand: exit code 0 on a clean end (stdin EOF
// or a signal), 2 on bad flags, 1 when the connection failed.
func runStdio(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	return runWithConfig("acpserver stdio", args, stderr, "stdio connection failed", func(cfg *serveConfig, log *slog.Logger) error {
		return serveStdio(ctx, cfg, stdin, stdout, log)
	})
}

// serveStdio serves one ACP connection on stdin/stdout with the same peer
// and session manager as a WebSocket connection; the connection's runtimes
// end (reason disconnected) when stdin reaches EOF.
func serveStdio(ctx context.Context, cfg *serveConfig, stdin io.Reader, stdout io.Writer, log *slog.Logger) error {
	// The client is the process that started us, on this host.
	core, err := newCore(ctx, cfg, log, true)
	if err != nil {
		return err
	}
	defer core.close(log)
	mgr := core.mgr
	id := uuid.NewString()
	clog := log.With("connection_id", id)
	tr := acp.NewStdioTransport(stdin, stdout, &acp.StdioOptions{MaxLineBytes: int(cfg.readLimit)})
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
	// A signal ends the runtimes as a shutdown (not a disconnect), then
	// the connection.
	served := make(chan struct{})
	var watcher sync.WaitGroup
	watcher.Go(func() {
		select {
		case <-ctx.Done():
			sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
			defer cancel()
			_ = core.shutdown(sctx)
			conn.Close()
		case <-served:
		}
	})
	cause := func() error {
		// The on-disconnect hook runs on every way out.
		defer client.Disconnect()
		return conn.Serve(context.Background(), client)
	}()
	close(served)
	watcher.Wait()

	sctx, cancel := context.WithTimeout(context.Background(), cfg.shutdownTimeout)
	defer cancel()
	if err := core.shutdown(sctx); err != nil {
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
