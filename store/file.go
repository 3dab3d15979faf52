package store

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"

	"github.com/google/uuid"
)

// File keeps records and history in a directory so sessions survive a
// restart or a crash:
//
//	DIR/sessions/ID/record.json    the record, replaced atomically
//	DIR/sessions/ID/history.jsonl  one session update per line, appended
//
// Appends go straight to the operating system (no fsync per update): a
// crashed process loses nothing, a crashed machine may lose the last
// updates. A torn last line is skipped when read. Records are indexed in
// memory at open; history is read from disk when asked for.
type File struct {
	dir string

	mu      sync.Mutex // guards recs, counter and every write under dir
	recs    map[string]*fileRec
	counter uint64
	now     func() time.Time
}

type fileRec struct {
	Record
	seq uint64
}

// recordFile is record.json.
type recordFile struct {
	ID        string    `json:"id"`
	Cwd       string    `json:"cwd"`
	Title     string    `json:"title,omitempty"`
	CreatedAt time.Time `json:"createdAt"`
}

// OpenFile opens (creating if needed) a store in dir and indexes the
// sessions already there.
func OpenFile(dir string) (*File, error) {
	root := filepath.Join(dir, "sessions")
	if err := os.MkdirAll(root, 0o700); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	f := &File{dir: root, recs: make(map[string]*fileRec), now: time.Now}
	ents, err := os.ReadDir(root)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	var loaded []*fileRec
	for _, e := range ents {
		if !e.IsDir() || !validID(e.Name()) {
			continue
		}
		r, err := f.readRecord(e.Name())
		if err != nil {
			continue // a session whose create did not finish
		}
		loaded = append(loaded, r)
	}
	slices.SortFunc(loaded, func(a, b *fileRec) int { return a.UpdatedAt.Compare(b.UpdatedAt) })
	for _, r := range loaded {
		f.counter++
		r.seq = f.counter
		f.recs[r.ID] = r
	}
	return f, nil
}

// validID admits only the ids this server mints, so no id can name a path
// outside the store.
func validID(id string) bool {
	u, err := uuid.Parse(id)
	return err == nil && u.String() == id
}

func (f *File) path(id string, name string) string { return filepath.Join(f.dir, id, name) }

func (f *File) readRecord(id string) (*fileRec, error) {
	b, err := os.ReadFile(f.path(id, "record.json"))
	if err != nil {
		return nil, err
	}
	var rf recordFile
	if err := json.Unmarshal(b, &rf); err != nil || rf.ID != id {
		return nil, fmt.Errorf("store: bad record for %s", id)
	}
	updated := rf.CreatedAt
	if st, err := os.Stat(f.path(id, "history.jsonl")); err == nil && st.ModTime().After(updated) {
		updated = st.ModTime()
		if err := endLine(f.path(id, "history.jsonl"), st.Size()); err != nil {
			return nil, err
		}
	}
	return &fileRec{Record: Record{ID: id, Cwd: rf.Cwd, Title: rf.Title, CreatedAt: rf.CreatedAt, UpdatedAt: updated}}, nil
}

// endLine ends a history file torn by a crash mid-write with a newline, so
// the torn line stays on its own (and is skipped) and later appends are
// whole lines.
func endLine(path string, size int64) error {
	if size == 0 {
		return nil
	}
	h, err := os.OpenFile(path, os.O_RDWR|os.O_APPEND, 0)
	if err != nil {
		return err
	}
	defer h.Close()
	last := make([]byte, 1)
	if _, err := h.ReadAt(last, size-1); err != nil {
		return err
	}
	if last[0] != '\n' {
		_, err = h.Write([]byte("\n"))
	}
	return err
}

// writeRecord replaces record.json atomically. f.mu is held.
func (f *File) writeRecord(r Record) error {
	b, err := json.Marshal(recordFile{ID: r.ID, Cwd: r.Cwd, Title: r.Title, CreatedAt: r.CreatedAt})
	if err != nil {
		return err
	}
	tmp := f.path(r.ID, "record.json.tmp")
	if err := os.WriteFile(tmp, b, 0o600); err != nil {
		return err
	}
	return os.Rename(tmp, f.path(r.ID, "record.json"))
}

func (f *File) Create(_ context.Context, rec Record) error {
	if !validID(rec.ID) {
		return fmt.Errorf("store: invalid session id %q", rec.ID)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.recs[rec.ID]; ok {
		return fmt.Errorf("store: session %s already exists", rec.ID)
	}
	now := f.now()
	if rec.CreatedAt.IsZero() {
		rec.CreatedAt = now
	}
	rec.UpdatedAt = now
	if err := os.Mkdir(filepath.Join(f.dir, rec.ID), 0o700); err != nil && !errors.Is(err, fs.ErrExist) {
		return fmt.Errorf("store: %w", err)
	}
	if err := f.writeRecord(rec); err != nil {
		os.RemoveAll(filepath.Join(f.dir, rec.ID))
		return fmt.Errorf("store: %w", err)
	}
	f.counter++
	f.recs[rec.ID] = &fileRec{Record: rec, seq: f.counter}
	return nil
}

func (f *File) Get(_ context.Context, id string) (Record, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.recs[id]
	if !ok {
		return Record{}, ErrNotFound
	}
	return r.Record, nil
}

func (f *File) List(_ context.Context, opts ListOptions) ([]Record, string, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	all := make([]sequenced, 0, len(f.recs))
	for _, r := range f.recs {
		all = append(all, sequenced{r.Record, r.seq})
	}
	return page(all, opts)
}

func (f *File) Delete(_ context.Context, id string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if _, ok := f.recs[id]; !ok {
		return ErrNotFound
	}
	delete(f.recs, id)
	if err := os.RemoveAll(filepath.Join(f.dir, id)); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

func (f *File) Append(_ context.Context, id string, entries ...Entry) error {
	var buf bytes.Buffer
	for _, e := range entries {
		if err := json.Compact(&buf, e); err != nil {
			return fmt.Errorf("store: history entry is not JSON: %w", err)
		}
		buf.WriteByte('\n')
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.recs[id]
	if !ok {
		return ErrNotFound
	}
	h, err := os.OpenFile(f.path(id, "history.jsonl"), os.O_APPEND|os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	_, werr := h.Write(buf.Bytes())
	if err := errors.Join(werr, h.Close()); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	r.UpdatedAt = f.now()
	f.counter++
	r.seq = f.counter
	return nil
}

func (f *File) History(_ context.Context, id string) ([]Entry, error) {
	f.mu.Lock()
	_, ok := f.recs[id]
	f.mu.Unlock()
	if !ok {
		return nil, ErrNotFound
	}
	h, err := os.Open(f.path(id, "history.jsonl"))
	if errors.Is(err, fs.ErrNotExist) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	defer h.Close()
	var out []Entry
	sc := bufio.NewScanner(h)
	sc.Buffer(make([]byte, 64<<10), 64<<20)
	for sc.Scan() {
		line := sc.Bytes()
		if !json.Valid(line) {
			continue // a line torn by a crash mid-write
		}
		out = append(out, append(Entry(nil), line...))
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	return out, nil
}

func (f *File) SetTitle(_ context.Context, id, title string) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	r, ok := f.recs[id]
	if !ok {
		return ErrNotFound
	}
	r.Title = title
	if err := f.writeRecord(r.Record); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}
