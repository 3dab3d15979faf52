package store

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"testing"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestMemoryRecordsAndHistory(t *testing.T) {
	ctx := context.Background()
	m := NewMemory()
	if err := m.Create(ctx, Record{ID: "a", Cwd: "/x"}); err != nil {
		t.Fatal(err)
	}
	if err := m.Create(ctx, Record{ID: "a", Cwd: "/x"}); err == nil {
		t.Fatal("duplicate create accepted")
	}
	if err := m.Append(ctx, "a", json.RawMessage(`1`), json.RawMessage(`2`)); err != nil {
		t.Fatal(err)
	}
	h, err := m.History(ctx, "a")
	if err != nil || len(h) != 2 || string(h[0]) != "1" || string(h[1]) != "2" {
		t.Fatalf("history %q %v", h, err)
	}
	if err := m.SetTitle(ctx, "a", "hello"); err != nil {
		t.Fatal(err)
	}
	if r, _ := m.Get(ctx, "a"); r.Title != "hello" || r.Cwd != "/x" {
		t.Fatalf("record %+v", r)
	}
	if err := m.Delete(ctx, "a"); err != nil {
		t.Fatal(err)
	}
	for _, err := range []error{
		m.Delete(ctx, "a"), m.Append(ctx, "a"), m.SetTitle(ctx, "a", "x"),
	} {
		if !errors.Is(err, ErrNotFound) {
			t.Fatalf("after delete: %v", err)
		}
	}
	if _, err := m.History(ctx, "a"); !errors.Is(err, ErrNotFound) {
		t.Fatal(err)
	}
}

func TestMemoryListPagesAndFilters(t *testing.T) {
	ctx := context.Background()
	m := NewMemory()
	for i := range 7 {
		cwd := "/even"
		if i%2 == 1 {
			cwd = "/odd"
		}
		if err := m.Create(ctx, Record{ID: fmt.Sprint(i), Cwd: cwd}); err != nil {
			t.Fatal(err)
		}
	}
	var seen []string
	cursor := ""
	for {
		recs, next, err := m.List(ctx, ListOptions{Limit: 3, Cursor: cursor})
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
	if fmt.Sprint(seen) != "[6 5 4 3 2 1 0]" {
		t.Fatalf("pages: %v", seen)
	}
	recs, _, _ := m.List(ctx, ListOptions{Cwd: "/odd"})
	if len(recs) != 3 {
		t.Fatalf("cwd filter: %v", recs)
	}
	if _, _, err := m.List(ctx, ListOptions{Cursor: "garbage!"}); err == nil {
		t.Fatal("malformed cursor accepted")
	}
}
