package mcpctx

import (
	"cmp"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	"github.com/mark3labs/mcp-go/mcp"
)

var errClientClosed = errors.New("MCP client closed")

// upstream is one MCP client: its transport, its process or HTTP stack,
// and its cached tools. It is owned by one Session (or the Pool), which
// closes it exactly once.
type upstream struct {
	cfg     ServerConfig
	version string // ours, sent in initialize
	log     *slog.Logger
	red     *redactor
	cli     *client.Client
	http    *httpClient // http and sse
	proc    *proc       // stdio

	// life is the client's lifetime: transports that keep streams open
	// (SSE, the streamable GET stream) run under it; close cancels it.
	life       context.Context
	cancelLife context.CancelFunc

	// reinitMu serializes re-initialization after the upstream dropped our
	// session (HTTP 404).
	reinitMu sync.Mutex

	mu    sync.Mutex
	tools []mcp.Tool

	refresh   chan struct{} // tools/list_changed seen; buffered 1
	onChange  func()        // called after the tools were refreshed
	refresher sync.WaitGroup

	closeOnce sync.Once
}

// startTimeout default and close timeout default.
const (
	defaultStartTimeout = 10 * time.Second
	defaultCloseTimeout = 5 * time.Second
)

// dial starts and initializes one server and lists its tools, all within
// startTimeout (and ctx). On any failure everything it started is released
// before it returns.
func dial(ctx context.Context, cfg ServerConfig, o *Options, log *slog.Logger) (u *upstream, err error) {
	u = &upstream{cfg: cfg, version: o.ClientVersion, log: log, red: newRedactor(cfg), refresh: make(chan struct{}, 1)}
	u.life, u.cancelLife = context.WithCancel(context.WithoutCancel(ctx))
	defer func() {
		if err != nil {
			u.close(o.closeTimeout())
			err = u.red.err(err)
			u = nil
		}
	}()
	// Bound the start by the timeout and by the caller's context; both end
	// the client's lifetime, which aborts whatever the start is waiting on.
	startTimer := time.AfterFunc(o.startTimeout(), u.cancelLife)
	stopOnCaller := context.AfterFunc(ctx, u.cancelLife)
	defer func() {
		startTimer.Stop()
		stopOnCaller()
		if err != nil && u != nil && u.life.Err() != nil {
			if ctx.Err() != nil {
				err = fmt.Errorf("start cancelled: %w", context.Cause(ctx))
			} else {
				err = fmt.Errorf("no answer within %s: %w", o.startTimeout(), err)
			}
		}
	}()

	var tr transport.Interface
	switch cfg.Kind {
	case "stdio":
		p, err := startProc(cfg)
		if err != nil {
			return u, err
		}
		u.proc = p
		tr = transport.NewIO(p.stdout, p.stdin, nil)
	case "http":
		u.http = newHTTPClient()
		tr, err = transport.NewStreamableHTTP(cfg.URL,
			transport.WithHTTPBasicClient(u.http.client),
			transport.WithHTTPHeaders(cfg.Headers),
			transport.WithContinuousListening(),
			transport.WithHTTPLogger(discard))
		if err != nil {
			return u, err
		}
	case "sse":
		u.http = newHTTPClient()
		tr, err = transport.NewSSE(cfg.URL,
			transport.WithHeaders(cfg.Headers),
			transport.WithHTTPClient(u.http.client),
			transport.WithSSELogger(discard))
		if err != nil {
			return u, err
		}
	default:
		return u, fmt.Errorf("unknown MCP server type %q", cfg.Kind)
	}
	// Legacy (session-ful) protocol versions only: they are what deployed
	// servers speak, they give an upstream session we end with DELETE, and
	// tools/list_changed arrives on the streams we already hold.
	u.cli = client.NewClient(tr, client.WithLegacyProtocolOnly())
	if err := u.cli.Start(u.life); err != nil {
		return u, u.withStderr(fmt.Errorf("connect: %w", err))
	}
	u.cli.OnNotification(func(n mcp.JSONRPCNotification) {
		if n.Method == mcp.MethodNotificationToolsListChanged {
			select {
			case u.refresh <- struct{}{}:
			default:
			}
		}
	})
	if err := u.initialize(u.life); err != nil {
		return u, u.withStderr(fmt.Errorf("initialize: %w", err))
	}
	if err := u.listTools(u.life); err != nil {
		return u, u.withStderr(fmt.Errorf("tools/list: %w", err))
	}
	return u, nil
}

var discard = slog.New(slog.DiscardHandler)

func (u *upstream) initialize(ctx context.Context) error {
	req := mcp.InitializeRequest{}
	req.Params.ProtocolVersion = mcp.LATEST_LEGACY_PROTOCOL_VERSION
	req.Params.ClientInfo = mcp.Implementation{Name: "acpserver", Version: cmp.Or(u.version, "dev")}
	_, err := u.cli.Initialize(ctx, req)
	return err
}

func (u *upstream) listTools(ctx context.Context) error {
	res, err := u.cli.ListTools(ctx, mcp.ListToolsRequest{})
	if errors.Is(err, transport.ErrSessionTerminated) {
		if err = u.reinit(ctx); err == nil {
			res, err = u.cli.ListTools(ctx, mcp.ListToolsRequest{})
		}
	}
	if err != nil {
		return err
	}
	u.mu.Lock()
	u.tools = res.Tools
	u.mu.Unlock()
	return nil
}

// startRefresher runs the tools/list_changed loop until close; onChange
// runs after each refresh.
func (u *upstream) startRefresher(onChange func()) {
	u.refresher.Go(func() {
		for {
			select {
			case <-u.life.Done():
				return
			case <-u.refresh:
			}
			ctx, cancel := context.WithTimeout(u.life, 30*time.Second)
			err := u.listTools(ctx)
			cancel()
			if err != nil {
				if u.life.Err() == nil {
					u.log.Warn("MCP tools refresh failed", "server", u.cfg.Name, "error", u.red.err(err))
				}
				continue
			}
			u.log.Debug("MCP tools refreshed", "server", u.cfg.Name)
			if onChange != nil {
				onChange()
			}
		}
	})
}

func (u *upstream) toolList() []mcp.Tool {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.tools
}

// reinit starts a new upstream session after the old one was dropped
// (HTTP 404). Concurrent callers share one re-initialization.
func (u *upstream) reinit(ctx context.Context) error {
	u.reinitMu.Lock()
	defer u.reinitMu.Unlock()
	if u.cli.GetTransport().GetSessionId() != "" {
		return nil // someone else re-initialized already
	}
	u.log.Info("MCP upstream ended our session; re-initializing", "server", u.cfg.Name)
	return u.initialize(ctx)
}

// call runs one tool; a dropped upstream session is re-initialized once and
// the call retried once.
func (u *upstream) call(ctx context.Context, tool string, args json.RawMessage) (*mcp.CallToolResult, error) {
	req := mcp.CallToolRequest{}
	req.Params.Name = tool
	if len(args) > 0 && string(args) != "null" {
		req.Params.Arguments = args
	}
	res, err := u.cli.CallTool(ctx, req)
	if errors.Is(err, transport.ErrSessionTerminated) && ctx.Err() == nil {
		if rerr := u.reinit(ctx); rerr != nil {
			return nil, u.red.err(fmt.Errorf("re-initialize after the upstream ended our session: %w", rerr))
		}
		res, err = u.cli.CallTool(ctx, req)
	}
	if err != nil {
		return nil, u.red.err(err)
	}
	return res, nil
}

// close releases the client within d: the transport's Close (HTTP: the
// upstream DELETE), then the process tree or the HTTP stack. It never
// blocks past d plus a small margin. Idempotent.
func (u *upstream) close(d time.Duration) (err error) {
	u.closeOnce.Do(func() { err = u.doClose(d) })
	return err
}

func (u *upstream) doClose(d time.Duration) error {
	deadline := time.Now().Add(d)
	var errs []error
	if u.cli != nil {
		done := make(chan error, 1)
		go func() { done <- u.cli.Close() }()
		t := time.NewTimer(d)
		select {
		case err := <-done:
			if err != nil {
				errs = append(errs, err)
			}
		case <-t.C:
			errs = append(errs, fmt.Errorf("transport close did not finish within %s", d))
			if u.http != nil {
				u.http.doKill() // aborts the DELETE, so Close returns
			}
			if u.proc != nil {
				u.proc.stop(0) // SIGKILL at once: the budget is spent
			}
			<-done
		}
		t.Stop()
	}
	u.cancelLife()
	u.refresher.Wait()
	if u.http != nil {
		u.http.release()
	}
	if u.proc != nil {
		if err := u.proc.stop(max(time.Until(deadline), 0)); err != nil {
			errs = append(errs, err)
		}
	}
	return u.red.err(errors.Join(errs...))
}

// withStderr adds the last line a stdio server wrote to stderr, which
// usually says why it failed.
func (u *upstream) withStderr(err error) error {
	if u.proc == nil {
		return err
	}
	// A server that failed usually exits at once; give its last words a
	// moment to reach the drain (EOF once every writer is gone).
	u.proc.waitExit(200 * time.Millisecond)
	t := time.NewTimer(200 * time.Millisecond)
	select {
	case <-u.proc.drained:
	case <-t.C:
	}
	t.Stop()
	if line := u.proc.tail.lastLine(); line != "" {
		return fmt.Errorf("%w (stderr: %s)", err, line)
	}
	return err
}
