package sessionmgr

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/mcpctx"
)

// An upstream whose DELETE hangs makes each MCP close take CloseTimeout.
// A sweep ends its idle runtimes in parallel, so joining the sweeper and
// shutting down stay within one close bound, not one per runtime.
func TestSweepDoesNotHoldUpShutdown(t *testing.T) {
	s := server.NewMCPServer("u", "1")
	s.AddTool(mcp.NewTool("x"), func(ctx context.Context, r mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("x"), nil
	})
	h := server.NewStreamableHTTPServer(s, server.WithStateful(true))
	release := make(chan struct{})
	hs := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodDelete {
			select {
			case <-release:
			case <-r.Context().Done():
			}
			return
		}
		h.ServeHTTP(w, r)
	}))
	defer hs.Close()
	defer close(release)

	m := New(Options{IdleTTL: 4 * time.Second, MCP: mcpctx.Options{CloseTimeout: time.Second}})
	c := connect(t, m, "c")
	defer c.Disconnect()
	const n = 6
	for range n {
		_, err := call(context.Background(), c, acp.MethodSessionNew, map[string]any{"cwd": "/w",
			"mcpServers": []any{map[string]any{"type": "http", "name": "u", "url": hs.URL, "headers": []any{}}}})
		if err != nil {
			t.Fatal(err)
		}
	}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Go(func() { m.RunSweeper(ctx) })
	for m.Snapshot().Ended[ReasonIdle] == 0 { // a sweep is under way
		time.Sleep(10 * time.Millisecond)
	}
	// SIGTERM now: core.shutdown = stopSweeper(); mgr.Shutdown(sctx)
	start := time.Now()
	cancel()
	wg.Wait()
	t.Logf("joining the sweeper took %s (idle ends: %d)", time.Since(start), m.Snapshot().Ended[ReasonIdle])
	sctx, scancel := context.WithTimeout(context.Background(), time.Second)
	defer scancel()
	_ = m.Shutdown(sctx)
	m.Wait()
	if d := time.Since(start); d > 2*time.Second {
		t.Errorf("shutdown with a 1s deadline took %s", d)
	}
}
