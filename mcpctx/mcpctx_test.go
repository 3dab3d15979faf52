package mcpctx

import (
	"context"
	"encoding/json"
	"errors"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func testUpstream(t *testing.T) *httptest.Server {
	t.Helper()
	s := server.NewMCPServer("t", "1", server.WithToolCapabilities(true))
	s.AddTool(mcp.NewTool("echo", mcp.WithString("text")), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		return mcp.NewToolResultText(req.GetString("text", "")), nil
	})
	s.AddTool(mcp.NewTool("block"), func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
		<-ctx.Done()
		return nil, ctx.Err()
	})
	hs := httptest.NewServer(server.NewStreamableHTTPServer(s, server.WithStateful(true)))
	t.Cleanup(func() { hs.CloseClientConnections(); hs.Close() })
	return hs
}

func TestOpenCallClose(t *testing.T) {
	hs := testUpstream(t)
	var c Counters
	s, fails := Open(context.Background(), "s1", []ServerConfig{
		{Name: "a", Kind: "http", URL: hs.URL + "/mcp"},
		{Name: "b", Kind: "http", URL: hs.URL + "/mcp"},
		{Name: "a", Kind: "http", URL: hs.URL + "/mcp"},
		{Name: "local", Kind: "stdio", Command: "true"},
	}, &Options{Counters: &c})
	if len(fails) != 2 || fails[0].Server != "a" || fails[1].Server != "local" || !strings.Contains(fails[1].Err.Error(), "not allowed") {
		t.Fatalf("failures: %v", fails)
	}
	if c.Clients.Load() != 2 || c.Toolsets.Load() != 1 {
		t.Fatalf("counters: clients %d toolsets %d", c.Clients.Load(), c.Toolsets.Load())
	}
	var names []string
	for _, tl := range s.Tools() {
		names = append(names, tl.Name)
	}
	if got := strings.Join(names, ","); got != "a/block,a/echo,b/block,b/echo" {
		t.Fatalf("tools %s", got)
	}
	res, err := s.Call(context.Background(), "b/echo", json.RawMessage(`{"text":"hi"}`))
	if err != nil || len(res.Content) != 1 || !strings.Contains(string(res.Content[0]), `"hi"`) {
		t.Fatalf("call: %v %s", err, res.Content)
	}
	if _, err := s.Call(context.Background(), "c/echo", nil); err == nil {
		t.Fatal("unknown server: no error")
	}

	// A call in flight is cancelled by Close and joined before it returns.
	errc := make(chan error, 1)
	go func() { _, err := s.Call(context.Background(), "a/block", nil); errc <- err }()
	for c.InflightCalls.Load() != 1 {
		time.Sleep(time.Millisecond)
	}
	s.Close(context.Background())
	if err := <-errc; !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("blocked call ended with %v", err)
	}
	if c.Clients.Load() != 0 || c.Toolsets.Load() != 0 || c.InflightCalls.Load() != 0 {
		t.Fatalf("counters after close: %d %d %d", c.Clients.Load(), c.Toolsets.Load(), c.InflightCalls.Load())
	}
	if _, err := s.Call(context.Background(), "a/echo", nil); !errors.Is(err, ErrSessionClosed) {
		t.Fatalf("call after close: %v", err)
	}
	s.Close(context.Background()) // idempotent
}

func TestStdioPolicy(t *testing.T) {
	p := StdioPolicy{Allow: true, Commands: []string{"npx"}}
	if err := p.check(ServerConfig{Command: "/usr/bin/npx"}); err != nil {
		t.Fatal(err)
	}
	if err := p.check(ServerConfig{Command: "sh"}); err == nil {
		t.Fatal("sh allowed")
	}
	if err := (StdioPolicy{Refusal: "why"}).check(ServerConfig{Command: "npx"}); err == nil || !strings.Contains(err.Error(), "why") {
		t.Fatalf("zero policy: %v", err)
	}
}

func TestRedact(t *testing.T) {
	r := newRedactor(ServerConfig{
		URL:     "http://user:pw-12345@h/mcp?token=tok-67890",
		Headers: map[string]string{"Authorization": "Bearer bear-abcdef"},
		Env:     map[string]string{"KEY": "env-secret"},
	})
	err := r.err(errors.New(`Post "http://user:pw-12345@h/mcp?token=tok-67890": bear-abcdef env-secret pw-12345 tok-67890`))
	for _, sec := range []string{"pw-12345", "tok-67890", "bear-abcdef", "env-secret"} {
		if strings.Contains(err.Error(), sec) {
			t.Fatalf("%q in %q", sec, err)
		}
	}
}
