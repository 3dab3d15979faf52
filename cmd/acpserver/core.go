package main

import (
	"context"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/acpserver/acpserver/mcpctx"
	"github.com/acpserver/acpserver/sessionmgr"
	"github.com/acpserver/acpserver/store"
)

// core is what every front end (the WebSocket server, stdio mode) shares:
// the global MCP pool, the agent, the session manager and its idle
// sweeper, all configured by the same flags.
type core struct {
	mgr         *sessionmgr.Manager
	pool        *mcpctx.Pool
	closeAgent  func()
	stopSweeper func()
}

// newCore starts the pool and the sweeper. localClient says the clients
// run on this host (loopback listener, or stdio), which permits their stdio
// MCP servers by default.
func newCore(ctx context.Context, cfg *serveConfig, log *slog.Logger, localClient bool) (*core, error) {
	pool, mcpOpts, err := startMCP(ctx, cfg, log, localClient)
	if err != nil {
		return nil, err
	}
	var st store.Store // nil: in memory
	if cfg.dataDir != "" {
		fst, err := store.OpenFile(cfg.dataDir)
		if err != nil {
			pool.Close()
			return nil, fmt.Errorf("--data-dir (%s): %w", envName("data-dir"), err)
		}
		st = fst
		log.Info("session store on disk", "dir", cfg.dataDir)
	}
	ag, closeAgent, err := cfg.agent.newAgent(log)
	if err != nil {
		pool.Close()
		return nil, err
	}
	mgr := sessionmgr.New(sessionmgr.Options{
		Store:              st,
		Agent:              ag,
		MCP:                mcpOpts,
		Logger:             log,
		EndTimeout:         cfg.endTimeout,
		IdleTTL:            cfg.limits.idleTTL,
		MaxSessions:        cfg.limits.maxSessions,
		MaxSessionsPerConn: cfg.limits.maxSessionsPerConn,
		AgentVersion:       version,
	})
	sweepCtx, stop := context.WithCancel(context.Background())
	var sweeper sync.WaitGroup
	sweeper.Go(func() { mgr.RunSweeper(sweepCtx) })
	var once sync.Once
	return &core{
		mgr:         mgr,
		pool:        pool,
		closeAgent:  closeAgent,
		stopSweeper: func() { once.Do(func() { stop(); sweeper.Wait() }) },
	}, nil
}

// shutdown stops idle sweeps, then ends every runtime (reason shutdown)
// within ctx.
func (c *core) shutdown(ctx context.Context) error {
	err := c.mgr.Shutdown(ctx) // refuses new work at once
	c.stopSweeper()            // a sweep under way ends its runtimes in parallel
	return err
}

// endGrace is how long close waits for runtimes still ending after the
// shutdown deadline: long enough for one bounded MCP close, so child
// process groups still get their SIGKILL and upstreams their DELETE.
const endGrace = 6 * time.Second

// close releases the process-wide parts once every session has ended.
func (c *core) close(log *slog.Logger) {
	c.stopSweeper()
	done := make(chan struct{})
	go func() { c.mgr.Wait(); close(done) }() // joined below, or abandoned at exit
	t := time.NewTimer(endGrace)
	select {
	case <-done:
	case <-t.C:
		log.Warn("runtimes still ending at exit", "grace", endGrace)
	}
	t.Stop()
	c.pool.Close()
	c.closeAgent()
}
