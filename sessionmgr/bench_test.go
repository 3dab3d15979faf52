package sessionmgr

import (
	"context"
	"testing"

	"github.com/acpserver/acpserver/acp"
)

// BenchmarkSessionLifecycle measures session/new, one echo prompt and
// session/close through the manager: the per-session bookkeeping cost.
func BenchmarkSessionLifecycle(b *testing.B) {
	m := New(Options{})
	c, err := m.Connect("bench", &recPeer{})
	if err != nil {
		b.Fatal(err)
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		id := mustNewB(b, c)
		if _, err := promptText(ctx, c, id, "hello"); err != nil {
			b.Fatal(err)
		}
		if _, err := call(ctx, c, acp.MethodSessionClose, map[string]any{"sessionId": id}); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	c.Disconnect()
	if s := m.Snapshot(); s.Sessions != 0 {
		b.Fatalf("left %d runtimes", s.Sessions)
	}
}

func mustNewB(b *testing.B, c *Client) string {
	out, err := call(context.Background(), c, acp.MethodSessionNew, map[string]any{"cwd": "/w", "mcpServers": []any{}})
	if err != nil {
		b.Fatal(err)
	}
	return string(out[len(`{"sessionId":"`) : len(out)-2])
}
