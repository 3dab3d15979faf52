package sessionmgr

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/acpserver/acpserver/acp"
)

func promptText(ctx context.Context, c *Client, id, text string) (acp.StopReason, error) {
	out, err := call(ctx, c, acp.MethodSessionPrompt, map[string]any{
		"sessionId": id, "prompt": []map[string]any{{"type": "text", "text": text}},
	})
	if err != nil {
		return "", err
	}
	var r acp.PromptResponse
	_ = json.Unmarshal(out, &r)
	return r.StopReason, nil
}

func TestIdleEvictionKeepsRecordAndRebuilds(t *testing.T) {
	const ttl = time.Minute
	m := New(Options{IdleTTL: ttl})
	c := connect(t, m, "c")
	defer c.Disconnect()
	id := mustNew(t, c)
	if _, err := promptText(context.Background(), c, id, "before"); err != nil {
		t.Fatal(err)
	}
	if n := m.Sweep(time.Now().Add(ttl / 2)); n != 0 {
		t.Fatalf("evicted %d runtimes before the TTL", n)
	}
	if n := m.Sweep(time.Now().Add(ttl + time.Second)); n != 1 {
		t.Fatalf("evicted %d, want 1", n)
	}
	s := m.Snapshot()
	if s.Sessions != 0 || s.Ended[ReasonIdle] != 1 {
		t.Fatalf("after eviction: %+v", s)
	}
	// The next prompt on the same connection rebuilds the runtime.
	if stop, err := promptText(context.Background(), c, id, "after"); err != nil || stop != acp.StopEndTurn {
		t.Fatalf("prompt after eviction: %v %v", stop, err)
	}
	if s := m.Snapshot(); s.Sessions != 1 {
		t.Fatalf("not rebuilt: %+v", s)
	}
	hist, _ := m.opts.Store.History(context.Background(), id)
	if len(hist) != 4 {
		t.Fatalf("history lost across eviction: %d entries", len(hist))
	}
}

func TestBusySessionIsNeverEvicted(t *testing.T) {
	const ttl = time.Minute
	m := New(Options{IdleTTL: ttl})
	c := connect(t, m, "c")
	defer c.Disconnect()
	id := mustNew(t, c)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		_, _ = promptText(ctx, c, id, "/sleep 1h")
	}()
	for m.Snapshot().InflightPrompts != 1 {
		time.Sleep(time.Millisecond)
	}
	if n := m.Sweep(time.Now().Add(10 * ttl)); n != 0 {
		t.Fatalf("evicted a session with a running prompt")
	}
	cancel()
	<-done
	// Finishing work renews the stamp.
	if n := m.Sweep(time.Now().Add(ttl / 2)); n != 0 {
		t.Fatalf("evicted right after work completed")
	}
}

func TestEvictedThenResumedElsewhereIsNotStolenBack(t *testing.T) {
	m := New(Options{IdleTTL: time.Minute})
	c1, c2 := connect(t, m, "c1"), connect(t, m, "c2")
	defer c1.Disconnect()
	defer c2.Disconnect()
	id := mustNew(t, c1)
	m.Sweep(time.Now().Add(time.Hour))
	if _, err := call(context.Background(), c2, acp.MethodSessionResume, map[string]any{"sessionId": id, "cwd": "/w", "mcpServers": []any{}}); err != nil {
		t.Fatal(err)
	}
	if _, err := promptText(context.Background(), c1, id, "mine?"); !errors.Is(err, acp.ErrNotFound) {
		t.Fatalf("old connection rebuilt a session resumed elsewhere: %v", err)
	}
	if s := m.Snapshot(); s.Sessions != 1 || s.Ended[ReasonSuperseded] != 0 {
		t.Fatalf("%+v", s)
	}
}

// TestEvictionRaces runs the sweeper against a prompt, a load and a resume
// of the same id: every runtime ends exactly once and nothing is left.
func TestEvictionRaces(t *testing.T) {
	m := New(Options{IdleTTL: time.Millisecond, EndTimeout: 2 * time.Second})
	created := 0
	for i := range 30 {
		c1, c2 := connect(t, m, fmt.Sprintf("a%d", i)), connect(t, m, fmt.Sprintf("b%d", i))
		id := mustNew(t, c1)
		created++
		var wg sync.WaitGroup
		var mu sync.Mutex
		ok := 0
		for range 3 {
			wg.Go(func() { m.Sweep(time.Now().Add(time.Hour)) })
		}
		wg.Go(func() { _, _ = promptText(context.Background(), c1, id, "hi") })
		for _, method := range []string{acp.MethodSessionLoad, acp.MethodSessionResume} {
			wg.Go(func() {
				if _, err := call(context.Background(), c2, method, map[string]any{"sessionId": id, "cwd": "/w", "mcpServers": []any{}}); err == nil {
					mu.Lock()
					ok++
					mu.Unlock()
				}
			})
		}
		wg.Wait()
		c1.Disconnect()
		c2.Disconnect()
		s := m.Snapshot()
		if s.Sessions != 0 || s.InflightPrompts != 0 {
			t.Fatalf("round %d: left behind %+v", i, s)
		}
		// Every runtime ever registered (the first, each successful load
		// or resume, each transparent rebuild) ended exactly once.
		m.mu.Lock()
		attached := m.attached
		m.mu.Unlock()
		if total := totalEnded(s); total != attached || attached < int64(created+ok) {
			t.Fatalf("round %d: %d runtimes attached, %d ends counted", i, attached, total)
		}
		created = int(attached)
	}
}

func TestSessionLimits(t *testing.T) {
	m := New(Options{MaxSessions: 3, MaxSessionsPerConn: 2})
	c1, c2 := connect(t, m, "c1"), connect(t, m, "c2")
	defer c1.Disconnect()
	defer c2.Disconnect()
	mustNew(t, c1)
	mustNew(t, c1)
	newSess := func(c *Client) error {
		_, err := call(context.Background(), c, acp.MethodSessionNew, map[string]any{"cwd": "/w", "mcpServers": []any{}})
		return err
	}
	if err := newSess(c1); !errors.Is(err, &acp.Error{Code: acp.CodeRetryLater}) {
		t.Fatalf("per-connection limit: %v", err)
	}
	if err := newSess(c2); err != nil {
		t.Fatal(err)
	}
	if err := newSess(c2); !errors.Is(err, &acp.Error{Code: acp.CodeRetryLater}) {
		t.Fatalf("total limit: %v", err)
	}
	if s := m.Snapshot(); s.Sessions != 3 {
		t.Fatalf("%+v", s)
	}
}

// TestSweeperRunsOnTimer drives the real sweeper under synctest's fake
// clock: a 40s TTL sweeps every 10s, so an unused runtime is gone between
// 40s and 50s, and one in use is not.
func TestSweeperRunsOnTimer(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		m := New(Options{IdleTTL: 40 * time.Second})
		c := connect(t, m, "c")
		defer c.Disconnect()
		idle, busy := mustNew(t, c), mustNew(t, c)
		ctx, cancel := context.WithCancel(context.Background())
		var wg sync.WaitGroup
		wg.Go(func() { m.RunSweeper(ctx) })
		for range 5 { // keep busy in use every 10s for 50s
			time.Sleep(10 * time.Second)
			if _, err := promptText(context.Background(), c, busy, "still here"); err != nil {
				t.Fatal(err)
			}
		}
		synctest.Wait()
		s := m.Snapshot()
		if s.Ended[ReasonIdle] != 1 || s.Sessions != 1 {
			t.Fatalf("after 50s: %+v", s)
		}
		if _, err := c.lookup(idle); err == nil {
			t.Fatal("the unused runtime is still attached")
		}
		cancel()
		wg.Wait()
	})
}
