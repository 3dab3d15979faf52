package acp

import (
	"context"
	"errors"
	"io"
	"strings"
	"testing"
	"time"
)

func TestStdioTransportFraming(t *testing.T) {
	in := "\n{\"a\":1}\r\n   \n{\"b\":2}\n{\"c\":3}"
	var out strings.Builder
	tr := NewStdioTransport(io.NopCloser(strings.NewReader(in)), nopWriteCloser{&out}, nil)
	defer func() { tr.Close(); <-tr.ReaderDone() }()
	ctx := context.Background()
	for _, want := range []string{`{"a":1}`, `{"b":2}`, `{"c":3}`} {
		got, err := tr.Read(ctx)
		if err != nil || string(got) != want {
			t.Fatalf("Read = %q, %v; want %q", got, err, want)
		}
	}
	if _, err := tr.Read(ctx); !errors.Is(err, io.EOF) {
		t.Fatalf("after the last line: %v, want io.EOF", err)
	}
	if err := tr.Write(ctx, []byte("{\n  \"x\": \"a\\nb\"\n}")); err != nil {
		t.Fatal(err)
	}
	if err := tr.Write(ctx, []byte(`{"y":1}`)); err != nil {
		t.Fatal(err)
	}
	if got, want := out.String(), "{\"x\":\"a\\nb\"}\n{\"y\":1}\n"; got != want {
		t.Fatalf("written %q, want %q", got, want)
	}
}

type nopWriteCloser struct{ io.Writer }

func (nopWriteCloser) Close() error { return nil }

func TestStdioTransportLineLimit(t *testing.T) {
	in := `{"ok":1}` + "\n" + strings.Repeat("x", 100) + "\n"
	tr := NewStdioTransport(strings.NewReader(in), io.Discard, &StdioOptions{MaxLineBytes: 50})
	defer func() { tr.Close(); <-tr.ReaderDone() }()
	if _, err := tr.Read(context.Background()); err != nil {
		t.Fatal(err)
	}
	if _, err := tr.Read(context.Background()); !errors.Is(err, ErrLineTooLong) {
		t.Fatalf("long line: %v, want ErrLineTooLong", err)
	}
}

func TestStdioTransportCloseUnblocksRead(t *testing.T) {
	pr, pw := io.Pipe()
	defer pw.Close()
	tr := NewStdioTransport(pr, io.Discard, nil)
	errc := make(chan error, 1)
	go func() { _, err := tr.Read(context.Background()); errc <- err }()
	tr.Close()
	if err := <-errc; !errors.Is(err, ErrClosed) {
		t.Fatalf("Read after Close: %v", err)
	}
	<-tr.ReaderDone()
}

// TestStdioServe runs a whole Conn over a stdio transport on pipes: a
// request in, its response out as one line, and EOF ending Serve cleanly.
func TestStdioServe(t *testing.T) {
	inR, inW := io.Pipe()
	outR, outW := io.Pipe()
	tr := NewStdioTransport(inR, outW, nil)
	c := NewConn(tr, nil)
	done := make(chan error, 1)
	go func() {
		done <- c.Serve(context.Background(), HandlerFunc(func(ctx context.Context, r *Request) (any, error) {
			return map[string]string{"method": r.Method}, nil
		}))
	}()
	lines := NewStdioTransport(outR, io.Discard, nil)
	defer func() { lines.Close(); <-lines.ReaderDone() }()
	if _, err := io.WriteString(inW, `{"jsonrpc":"2.0","id":7,"method":"ping"}`+"\n"); err != nil {
		t.Fatal(err)
	}
	got, err := lines.Read(context.Background())
	if err != nil || string(got) != `{"jsonrpc":"2.0","id":7,"result":{"method":"ping"}}` {
		t.Fatalf("response %q %v", got, err)
	}
	inW.Close()
	if err := <-done; !errors.Is(err, io.EOF) {
		t.Fatalf("Serve ended with %v, want io.EOF", err)
	}
	<-tr.ReaderDone()
}

// TestStdioWriteToAPeerThatStoppedReading: a Write stuck on a pipe nobody
// reads returns when its context ends, and Close ends the writer.
func TestStdioWriteToAPeerThatStoppedReading(t *testing.T) {
	pr, pw := io.Pipe()
	defer pr.Close()
	tr := NewStdioTransport(strings.NewReader(""), pw, nil)
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	if err := tr.Write(ctx, []byte(`{"stuck":true}`)); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("stuck write returned %v", err)
	}
	tr.Close()
	<-tr.WriterDone()
	<-tr.ReaderDone()
}
