package sessionmgr

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/store"
)

// failPeer fails every notification, like a connection whose load request
// was cancelled ($/cancel_request) or whose outbox is closed.
type failPeer struct{ recPeer }

func (p *failPeer) Notify(ctx context.Context, method string, params any) error {
	return errors.New("peer gone")
}

// A session/load whose history replay fails answers with an error and
// leaves no runtime attached to the connection.
func TestFailedLoadLeavesNoRuntime(t *testing.T) {
	m := New(Options{})
	c1 := connect(t, m, "c1")
	id := mustNew(t, c1)
	if _, err := promptText(context.Background(), c1, id, "hello"); err != nil {
		t.Fatal(err)
	}
	c1.Disconnect()
	c2, err := m.Connect("c2", &failPeer{})
	if err != nil {
		t.Fatal(err)
	}
	defer c2.Disconnect()
	_, err = call(context.Background(), c2, acp.MethodSessionLoad, map[string]any{"sessionId": id, "cwd": "/w", "mcpServers": []any{}})
	if err == nil {
		t.Fatal("load succeeded")
	}
	if s := m.Snapshot(); s.Sessions != 0 {
		t.Fatalf("load failed (%v) but a runtime is live: %+v", err, s)
	}
}

// gateStore blocks the first Get of a chosen id until released.
type gateStore struct {
	store.Store
	mu      sync.Mutex
	gate    chan struct{}
	reached chan struct{}
	id      string
}

func (g *gateStore) Get(ctx context.Context, id string) (store.Record, error) {
	r, err := g.Store.Get(ctx, id)
	g.mu.Lock()
	gate := g.gate
	if id == g.id && gate != nil {
		g.gate = nil
		g.mu.Unlock()
		close(g.reached)
		<-gate
		return r, err
	}
	g.mu.Unlock()
	return r, err
}

// A load that passed its record check races a delete: once the delete is
// answered, no runtime (with its MCP clients) of the deleted session lives.
func TestDeleteRacingLoad(t *testing.T) {
	gs := &gateStore{Store: store.NewMemory()}
	m := New(Options{Store: gs})
	c1 := connect(t, m, "c1")
	c2 := connect(t, m, "c2")
	defer c1.Disconnect()
	defer c2.Disconnect()
	id := mustNew(t, c1)
	gs.mu.Lock()
	gs.id, gs.gate, gs.reached = id, make(chan struct{}), make(chan struct{})
	gate := gs.gate
	gs.mu.Unlock()
	done := make(chan error, 1)
	go func() {
		_, err := call(context.Background(), c2, acp.MethodSessionLoad, map[string]any{"sessionId": id, "cwd": "/w", "mcpServers": []any{}})
		done <- err
	}()
	<-gs.reached
	if _, err := call(context.Background(), c1, acp.MethodSessionDelete, map[string]any{"sessionId": id}); err != nil {
		t.Fatal(err)
	}
	close(gate)
	err := <-done
	time.Sleep(10 * time.Millisecond)
	if _, gerr := gs.Store.Get(context.Background(), id); !errors.Is(gerr, store.ErrNotFound) {
		t.Fatal("record survived")
	}
	if s := m.Snapshot(); s.Sessions != 0 {
		t.Fatalf("load after delete: err=%v; runtime of a deleted session is live: %+v", err, s)
	}
}
