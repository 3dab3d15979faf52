package sessionmgr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"go.uber.org/goleak"

	"github.com/acpserver/acpserver/acp"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// recPeer stands in for the connection: it records notifications.
type recPeer struct {
	mu    sync.Mutex
	notes []acp.SessionNotification
}

func (p *recPeer) Notify(_ context.Context, method string, params any) error {
	if n, ok := params.(acp.SessionNotification); ok {
		p.mu.Lock()
		p.notes = append(p.notes, n)
		p.mu.Unlock()
	}
	return nil
}

func (p *recPeer) Call(ctx context.Context, method string, params, result any) error {
	return acp.Errorf(acp.CodeMethodNotFound, "no client methods in this test")
}

var reqID atomic.Int64

func call(ctx context.Context, c *Client, method string, params any) (json.RawMessage, error) {
	b, _ := json.Marshal(params)
	res, err := c.Handle(ctx, &acp.Request{ID: json.RawMessage(fmt.Sprint(reqID.Add(1))), Method: method, Params: b})
	if err != nil {
		return nil, err
	}
	if fu, ok := res.(acp.FollowUp); ok {
		res = fu.Result
		fu.Then()
	}
	out, _ := json.Marshal(res)
	return out, nil
}

func mustNew(t *testing.T, c *Client) string {
	t.Helper()
	out, err := call(context.Background(), c, acp.MethodSessionNew, map[string]any{"cwd": "/w", "mcpServers": []any{}})
	if err != nil {
		t.Fatal(err)
	}
	var r acp.NewSessionResponse
	_ = json.Unmarshal(out, &r)
	return r.SessionID
}

func connect(t *testing.T, m *Manager, id string) *Client {
	t.Helper()
	c, err := m.Connect(id, &recPeer{})
	if err != nil {
		t.Fatal(err)
	}
	return c
}

func totalEnded(s Snapshot) int64 {
	var n int64
	for _, v := range s.Ended {
		n += v
	}
	return n
}

// TestEndSessionRaces ends one runtime from every direction at once: itself
// (three times), a running prompt, a resume from another connection and a
// disconnect. Every runtime must end exactly once and nothing may be left.
func TestEndSessionRaces(t *testing.T) {
	m := New(Options{EndTimeout: 2 * time.Second})
	const rounds = 40
	created := 0
	for i := range rounds {
		c1 := connect(t, m, fmt.Sprintf("a%d", i))
		c2 := connect(t, m, fmt.Sprintf("b%d", i))
		id := mustNew(t, c1)
		created++

		var wg sync.WaitGroup
		promptStarted := make(chan struct{})
		wg.Go(func() {
			close(promptStarted)
			_, _ = call(context.Background(), c1, acp.MethodSessionPrompt, map[string]any{
				"sessionId": id, "prompt": []map[string]any{{"type": "text", "text": "/sleep 30s"}},
			})
		})
		<-promptStarted
		// Let the prompt register, so every ender races a running turn.
		for deadline := time.Now().Add(5 * time.Second); m.Snapshot().InflightPrompts != 1 && time.Now().Before(deadline); {
			time.Sleep(time.Millisecond)
		}
		for range 3 {
			wg.Go(func() { m.EndSession(id, ReasonClosed) })
		}
		var resumed atomic.Bool
		wg.Go(func() {
			_, err := call(context.Background(), c2, acp.MethodSessionResume, map[string]any{"sessionId": id, "cwd": "/w", "mcpServers": []any{}})
			resumed.Store(err == nil)
		})
		wg.Go(c1.Disconnect)
		wg.Wait()
		if resumed.Load() {
			created++
		}
		c2.Disconnect()

		s := m.Snapshot()
		if s.Sessions != 0 || s.InflightPrompts != 0 || s.Connections != 0 {
			t.Fatalf("round %d: left behind: %+v", i, s)
		}
		if got := totalEnded(s); got != int64(created) {
			t.Fatalf("round %d: %d runtimes created, %d ends counted (%v)", i, created, got, s.Ended)
		}
	}
	if err := m.Shutdown(context.Background()); err != nil {
		t.Fatal(err)
	}
	m.Wait()
}

func TestSupersedeAcrossConnections(t *testing.T) {
	m := New(Options{})
	c1 := connect(t, m, "c1")
	c2 := connect(t, m, "c2")
	id := mustNew(t, c1)
	if _, err := call(context.Background(), c2, acp.MethodSessionResume, map[string]any{"sessionId": id, "cwd": "/w", "mcpServers": []any{}}); err != nil {
		t.Fatal(err)
	}
	s := m.Snapshot()
	if s.Ended[ReasonSuperseded] != 1 || s.Sessions != 1 {
		t.Fatalf("after resume elsewhere: %+v", s)
	}
	// The first connection may no longer drive the session.
	_, err := call(context.Background(), c1, acp.MethodSessionPrompt, map[string]any{"sessionId": id, "prompt": []any{}})
	if !errors.Is(err, acp.ErrNotFound) {
		t.Fatalf("prompt on the superseded connection: %v", err)
	}
	c1.Disconnect()
	if s := m.Snapshot(); s.Sessions != 1 || s.Ended[ReasonDisconnected] != 0 {
		t.Fatalf("disconnecting the old connection touched the new runtime: %+v", s)
	}
	c2.Disconnect()
	if s := m.Snapshot(); s.Sessions != 0 || s.Ended[ReasonDisconnected] != 1 {
		t.Fatalf("after disconnect: %+v", s)
	}
}

func TestShutdownEndsEverything(t *testing.T) {
	m := New(Options{EndTimeout: time.Second})
	c := connect(t, m, "c")
	var wg sync.WaitGroup
	for range 5 {
		id := mustNew(t, c)
		wg.Go(func() {
			_, _ = call(context.Background(), c, acp.MethodSessionPrompt, map[string]any{
				"sessionId": id, "prompt": []map[string]any{{"type": "text", "text": "/sleep 30s"}},
			})
		})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := m.Shutdown(ctx); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
	m.Wait()
	s := m.Snapshot()
	if s.Sessions != 0 || s.Ended[ReasonShutdown] != 5 || s.InflightPrompts != 0 {
		t.Fatalf("after shutdown: %+v", s)
	}
	if _, err := m.Connect("late", &recPeer{}); !errors.Is(err, ErrShuttingDown) {
		t.Fatalf("connect after shutdown: %v", err)
	}
	if _, err := call(context.Background(), c, acp.MethodSessionNew, map[string]any{"cwd": "/w", "mcpServers": []any{}}); err == nil {
		t.Fatal("session/new after shutdown succeeded")
	}
	c.Disconnect()
}

func TestInvalidParams(t *testing.T) {
	m := New(Options{})
	c := connect(t, m, "c")
	defer c.Disconnect()
	for _, tc := range []struct {
		method string
		params string
	}{
		{acp.MethodSessionNew, `{"mcpServers":[]}`},
		{acp.MethodSessionNew, `{"cwd":"relative","mcpServers":[]}`},
		{acp.MethodSessionNew, `{"cwd":7}`},
		{acp.MethodSessionNew, `{"cwd":"/w","mcpServers":[{"name":"x"}]}`},
		{acp.MethodSessionNew, `{"cwd":"/w","mcpServers":[{"type":"ftp","name":"x","url":"u"}]}`},
		{acp.MethodSessionPrompt, `{"sessionId":"s"}`},
		{acp.MethodSessionLoad, `{"cwd":"/w","mcpServers":[]}`},
		{acp.MethodSessionList, `{"cursor":"!!"}`},
		{acp.MethodInitialize, `{}`},
	} {
		_, err := c.Handle(context.Background(), &acp.Request{ID: json.RawMessage("1"), Method: tc.method, Params: json.RawMessage(tc.params)})
		if !errors.Is(err, acp.ErrInvalidParams) {
			t.Errorf("%s %s: want invalid params, got %v", tc.method, tc.params, err)
		}
	}
}
