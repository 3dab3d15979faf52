package store

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"

	"github.com/google/uuid"
	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

// stores runs a contract test against every implementation.
func stores(t *testing.T, test func(t *testing.T, s Store)) {
	t.Run("memory", func(t *testing.T) { test(t, NewMemory()) })
	t.Run("file", func(t *testing.T) {
		f, err := OpenFile(t.TempDir())
		if err != nil {
			t.Fatal(err)
		}
		test(t, f)
	})
}

func TestRecordsAndHistory(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		id := uuid.NewString()
		if err := s.Create(ctx, Record{ID: id, Cwd: "/x"}); err != nil {
			t.Fatal(err)
		}
		if err := s.Create(ctx, Record{ID: id, Cwd: "/x"}); err == nil {
			t.Fatal("duplicate create accepted")
		}
		if h, err := s.History(ctx, id); err != nil || len(h) != 0 {
			t.Fatalf("new history %q %v", h, err)
		}
		if err := s.Append(ctx, id, json.RawMessage(`{"n":1}`), json.RawMessage(`{"n":2}`)); err != nil {
			t.Fatal(err)
		}
		h, err := s.History(ctx, id)
		if err != nil || len(h) != 2 || string(h[0]) != `{"n":1}` || string(h[1]) != `{"n":2}` {
			t.Fatalf("history %q %v", h, err)
		}
		if err := s.SetTitle(ctx, id, "hello"); err != nil {
			t.Fatal(err)
		}
		if r, _ := s.Get(ctx, id); r.Title != "hello" || r.Cwd != "/x" {
			t.Fatalf("record %+v", r)
		}
		if err := s.Delete(ctx, id); err != nil {
			t.Fatal(err)
		}
		for _, err := range []error{
			s.Delete(ctx, id), s.Append(ctx, id), s.SetTitle(ctx, id, "x"),
		} {
			if !errors.Is(err, ErrNotFound) {
				t.Fatalf("after delete: %v", err)
			}
		}
		if _, err := s.History(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Fatal(err)
		}
	})
}

func TestListPagesAndFilters(t *testing.T) {
	stores(t, func(t *testing.T, s Store) {
		ctx := context.Background()
		var ids []string
		for i := range 7 {
			cwd := "/even"
			if i%2 == 1 {
				cwd = "/odd"
			}
			id := uuid.NewString()
			ids = append(ids, id)
			if err := s.Create(ctx, Record{ID: id, Cwd: cwd}); err != nil {
				t.Fatal(err)
			}
		}
		var seen []string
		cursor := ""
		for {
			recs, next, err := s.List(ctx, ListOptions{Limit: 3, Cursor: cursor})
			if err != nil {
				t.Fatal(err)
			}
			for _, r := range recs {
				seen = append(seen, r.ID)
			}
			if next == "" {
				break
			}
			cursor = next
		}
		if len(seen) != 7 {
			t.Fatalf("pages: %v", seen)
		}
		for i, id := range seen {
			if id != ids[6-i] {
				t.Fatalf("not newest first: %v", seen)
			}
		}
		recs, _, _ := s.List(ctx, ListOptions{Cwd: "/odd"})
		if len(recs) != 3 {
			t.Fatalf("cwd filter: %v", recs)
		}
		if _, _, err := s.List(ctx, ListOptions{Cursor: "garbage!"}); err == nil {
			t.Fatal("malformed cursor accepted")
		}
	})
}

// TestFileSurvivesReopen: records, titles and history come back after a
// restart, in order, and a line torn by a crash is skipped without
// damaging later appends.
func TestFileSurvivesReopen(t *testing.T) {
	ctx := context.Background()
	dir := t.TempDir()
	f, err := OpenFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	a, b := uuid.NewString(), uuid.NewString()
	for _, id := range []string{a, b} {
		if err := f.Create(ctx, Record{ID: id, Cwd: "/w"}); err != nil {
			t.Fatal(err)
		}
	}
	_ = f.SetTitle(ctx, a, "first")
	_ = f.Append(ctx, a, json.RawMessage(`{"n":1}`))
	// A crash mid-write leaves half a line.
	h, _ := os.OpenFile(filepath.Join(dir, "sessions", a, "history.jsonl"), os.O_APPEND|os.O_WRONLY, 0)
	h.Write([]byte(`{"n":`))
	h.Close()

	g, err := OpenFile(dir)
	if err != nil {
		t.Fatal(err)
	}
	if r, err := g.Get(ctx, a); err != nil || r.Title != "first" || r.Cwd != "/w" {
		t.Fatalf("record after reopen: %+v %v", r, err)
	}
	if err := g.Append(ctx, a, json.RawMessage(`{"n":2}`)); err != nil {
		t.Fatal(err)
	}
	hist, err := g.History(ctx, a)
	if err != nil || len(hist) != 2 || string(hist[0]) != `{"n":1}` || string(hist[1]) != `{"n":2}` {
		t.Fatalf("history after reopen: %q %v", hist, err)
	}
	if recs, _, _ := g.List(ctx, ListOptions{}); len(recs) != 2 || recs[0].ID != a {
		t.Fatalf("list after reopen: %+v", recs)
	}
}

func TestFileRejectsForeignIDs(t *testing.T) {
	f, err := OpenFile(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	ctx := context.Background()
	for _, id := range []string{"../../etc", "a/b", "", "ABCDEF00-0000-4000-8000-000000000000"} {
		if err := f.Create(ctx, Record{ID: id}); err == nil {
			t.Errorf("id %q accepted", id)
		}
		if _, err := f.History(ctx, id); !errors.Is(err, ErrNotFound) {
			t.Errorf("history of %q: %v", id, err)
		}
	}
}
