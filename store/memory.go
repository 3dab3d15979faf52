package store

import (
	"cmp"
	"context"
	"encoding/base64"
	"fmt"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Memory is an in-process Store; everything is lost at exit.
type Memory struct {
	mu      sync.Mutex
	recs    map[string]*memRec
	now     func() time.Time
	counter uint64
}

type memRec struct {
	Record
	seq     uint64 // order of last update, for stable listing
	history []Entry
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory {
	return &Memory{recs: make(map[string]*memRec), now: time.Now}
}

func (m *Memory) Create(_ context.Context, rec Record) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.recs[rec.ID]; ok {
		return fmt.Errorf("store: session %s already exists", rec.ID)
	}
	now := m.now()
	if rec.CreatedAt.IsZero() {
		rec.CreatedAt = now
	}
	rec.UpdatedAt = now
	m.counter++
	m.recs[rec.ID] = &memRec{Record: rec, seq: m.counter}
	return nil
}

func (m *Memory) Get(_ context.Context, id string) (Record, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[id]
	if !ok {
		return Record{}, ErrNotFound
	}
	return r.Record, nil
}

// List pages newest-updated first.
func (m *Memory) List(_ context.Context, opts ListOptions) ([]Record, string, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	all := make([]sequenced, 0, len(m.recs))
	for _, r := range m.recs {
		all = append(all, sequenced{r.Record, r.seq})
	}
	return page(all, opts)
}

// sequenced is a record with the order of its last update.
type sequenced struct {
	Record
	seq uint64
}

// page filters, orders (seq descending) and pages records; the cursor
// encodes the last seq seen.
func page(all []sequenced, opts ListOptions) ([]Record, string, error) {
	limit := opts.Limit
	if limit <= 0 {
		limit = 50
	}
	var after uint64
	if opts.Cursor != "" {
		b, err := base64.RawURLEncoding.DecodeString(opts.Cursor)
		if err != nil || !strings.HasPrefix(string(b), "seq:") {
			return nil, "", fmt.Errorf("store: malformed cursor")
		}
		after, err = strconv.ParseUint(strings.TrimPrefix(string(b), "seq:"), 10, 64)
		if err != nil {
			return nil, "", fmt.Errorf("store: malformed cursor")
		}
	}
	kept := all[:0]
	for _, r := range all {
		if opts.Cwd != "" && r.Cwd != opts.Cwd {
			continue
		}
		if after != 0 && r.seq >= after {
			continue
		}
		kept = append(kept, r)
	}
	slices.SortFunc(kept, func(a, b sequenced) int { return cmp.Compare(b.seq, a.seq) })
	var out []Record
	next := ""
	for i, r := range kept {
		if i == limit {
			next = base64.RawURLEncoding.EncodeToString([]byte("seq:" + strconv.FormatUint(kept[i-1].seq, 10)))
			break
		}
		out = append(out, r.Record)
	}
	return out, next, nil
}

func (m *Memory) Delete(_ context.Context, id string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.recs[id]; !ok {
		return ErrNotFound
	}
	delete(m.recs, id)
	return nil
}

func (m *Memory) Append(_ context.Context, id string, entries ...Entry) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[id]
	if !ok {
		return ErrNotFound
	}
	for _, e := range entries {
		r.history = append(r.history, append(Entry(nil), e...))
	}
	r.UpdatedAt = m.now()
	m.counter++
	r.seq = m.counter
	return nil
}

func (m *Memory) History(_ context.Context, id string) ([]Entry, error) {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[id]
	if !ok {
		return nil, ErrNotFound
	}
	return slices.Clone(r.history), nil
}

func (m *Memory) SetTitle(_ context.Context, id, title string) error {
	m.mu.Lock()
	defer m.mu.Unlock()
	r, ok := m.recs[id]
	if !ok {
		return ErrNotFound
	}
	r.Title = title
	return nil
}
