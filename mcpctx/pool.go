package mcpctx

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
)

type mcpTool = mcp.Tool

// Pool is the process-wide set of globally configured servers: one client
// each, started at boot, closed at shutdown, their tools cached once and
// refreshed on tools/list_changed. Every session sees their tools under
// the configured names. Global servers come from the operator's config, so
// the stdio policy does not apply to them.
type Pool struct {
	log  *slog.Logger
	opts Options

	mu     sync.Mutex
	ups    map[string]*upstream
	order  []string
	closed bool
}

// NewPool starts every server in parallel. Servers that fail are returned
// and left out.
func NewPool(ctx context.Context, servers []ServerConfig, opts *Options) (*Pool, []Failure) {
	p := &Pool{ups: make(map[string]*upstream)}
	if opts != nil {
		p.opts = *opts
	}
	p.opts.Stdio = StdioPolicy{Allow: true}
	p.log = p.opts.logger()
	var (
		mu    sync.Mutex
		wg    sync.WaitGroup
		fails []Failure
	)
	for _, sc := range servers {
		p.order = append(p.order, sc.Name)
		wg.Go(func() {
			u, err := dial(ctx, sc, &p.opts, p.log.With("scope", "global"))
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				fails = append(fails, Failure{Server: sc.Name, Err: err})
				return
			}
			p.ups[sc.Name] = u
		})
	}
	wg.Wait()
	for name, u := range p.ups {
		u.startRefresher(func() { p.log.Info("global MCP server tools changed", "server", name, "tools", len(u.toolList())) })
	}
	return p, fails
}

func (p *Pool) upstream(name string) *upstream {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.ups[name]
}

func (p *Pool) upstreams() []*upstream {
	if p == nil {
		return nil
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]*upstream, 0, len(p.ups))
	for _, n := range p.order {
		if u := p.ups[n]; u != nil {
			out = append(out, u)
		}
	}
	return out
}

// Len is the number of live global clients.
func (p *Pool) Len() int {
	if p == nil {
		return 0
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.ups)
}

// Close closes every global client in parallel, each bounded. Call it
// after every session has ended. Idempotent.
func (p *Pool) Close() {
	if p == nil {
		return
	}
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	ups := p.ups
	p.ups = map[string]*upstream{}
	p.mu.Unlock()
	var wg sync.WaitGroup
	d := p.opts.closeTimeout()
	for name, u := range ups {
		wg.Go(func() {
			start := time.Now()
			if err := u.close(d); err != nil {
				p.log.Warn("global MCP client close failed", "server", name, "error", err)
				return
			}
			p.log.Debug("global MCP client closed", "server", name, "took", time.Since(start).Round(time.Microsecond))
		})
	}
	wg.Wait()
}
