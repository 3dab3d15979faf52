package integration

import (
	"context"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

// An SSE upstream: its event stream is open while the session runs and
// closed once the runtime ends, whichever way.
func TestMCPSSEUpstream(t *testing.T) {
	ms := mcpserver.NewMCPServer("sse-upstream", "1.0.0", mcpserver.WithToolCapabilities(true))
	ms.AddTool(mcp.NewTool("whoami"), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText("sse"), nil
	})
	var streams atomic.Int64
	var hs *httptest.Server
	hs = httptest.NewUnstartedServer(nil)
	sse := mcpserver.NewSSEServer(ms, mcpserver.WithBaseURL("http://"+hs.Listener.Addr().String()), mcpserver.WithKeepAlive(false))
	hs.Config.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodGet {
			streams.Add(1)
			defer streams.Add(-1)
		}
		sse.ServeHTTP(w, r)
	})
	hs.Start()
	t.Cleanup(func() { hs.CloseClientConnections(); hs.Close() })

	s := startServer(t)
	for _, way := range endWays {
		t.Run(way.name, func(t *testing.T) {
			c := dial(t, s)
			c.initialize()
			sid := c.newSession("/tmp", map[string]any{"type": "sse", "name": "up", "url": hs.URL + "/sse", "headers": []any{}})
			if st, text := c.callTool(sid, "up/whoami", "{}"); st != "completed" || text != "sse" {
				t.Fatalf("call: %s %q", st, text)
			}
			if n := streams.Load(); n != 1 {
				t.Fatalf("%d SSE streams open while the session runs", n)
			}
			way.end(t, s, c, sid)
			c.close()
			s.waitIdle(t, 10*time.Second)
			deadline := time.Now().Add(5 * time.Second)
			for streams.Load() != 0 {
				if time.Now().After(deadline) {
					t.Fatalf("%d SSE streams still open after the runtime ended", streams.Load())
				}
				time.Sleep(10 * time.Millisecond)
			}
		})
	}
}
