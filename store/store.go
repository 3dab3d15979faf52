// Package store keeps session records and their conversation history. The
// record outlives every runtime: it ends only with session/delete.
package store

import (
	"context"
	"encoding/json"
	"errors"
	"time"
)

// ErrNotFound is returned for an id the store does not hold.
var ErrNotFound = errors.New("store: session not found")

// Record is what survives disconnects: enough to list a session and to
// rebuild its runtime.
type Record struct {
	ID        string
	Cwd       string
	Title     string
	CreatedAt time.Time
	UpdatedAt time.Time
}

// Entry is one history item: the exact session/update payload the client
// saw, kept in order so session/load replays it verbatim and an agent can
// rebuild its model context from it.
type Entry = json.RawMessage

// ListOptions filter and page a listing.
type ListOptions struct {
	Cwd    string // only sessions with this cwd; empty means all
	Cursor string // opaque, from a previous page
	Limit  int    // page size; 0 means 50
}

// Store is the persistence boundary. Implementations are safe for
// concurrent use.
type Store interface {
	Create(ctx context.Context, rec Record) error
	Get(ctx context.Context, id string) (Record, error)
	// List returns records newest-updated first and a cursor for the next
	// page ("" when there is none).
	List(ctx context.Context, opts ListOptions) ([]Record, string, error)
	Delete(ctx context.Context, id string) error
	// Append adds history entries and bumps UpdatedAt.
	Append(ctx context.Context, id string, entries ...Entry) error
	History(ctx context.Context, id string) ([]Entry, error)
	// SetTitle names the session (from its first prompt).
	SetTitle(ctx context.Context, id, title string) error
}
