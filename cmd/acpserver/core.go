package main

import (
	"context"
	"log/slog"
	"sync"

	"github.com/acpserver/acpserver/mcpctx"
	"github.com/acpserver/acpserver/sessionmgr"
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
	ag, closeAgent, err := cfg.agent.newAgent(log)
	if err != nil {
		pool.Close()
		return nil, err
	}
	mgr := sessionmgr.New(sessionmgr.Options{
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
	c.stopSweeper()
	return c.mgr.Shutdown(ctx)
}

// close releases the process-wide parts once every session has ended.
func (c *core) close() {
	c.stopSweeper()
	c.pool.Close()
	c.closeAgent()
}
