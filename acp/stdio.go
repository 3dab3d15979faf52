package acp

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sync"
)

// DefaultMaxLineBytes bounds one stdio message when StdioOptions leaves it
// unset: the same 4 MiB the WebSocket endpoint accepts by default.
const DefaultMaxLineBytes = 4 << 20

// ErrLineTooLong ends a stdio connection whose peer sent a line longer than
// the limit; the rest of the stream can no longer be framed reliably.
var ErrLineTooLong = errors.New("acp: stdio message exceeds the line length limit")

// StdioOptions tune a StdioTransport; nil means defaults.
type StdioOptions struct {
	// MaxLineBytes is the longest accepted line (one message), without its
	// newline. Default DefaultMaxLineBytes.
	MaxLineBytes int
}

// StdioTransport is the ACP stdio transport: newline-delimited JSON-RPC,
// one JSON value per line, over a reader and a writer (a process's stdin
// and stdout). Blank lines are skipped and a trailing "\r" is dropped.
//
// Concurrency: Read and Write are each called from one goroutine at a time
// (acp.Transport's contract). Close may race with both; it unblocks Read at
// once. A goroutine owned by the transport reads r; it ends when r returns
// an error, which Close provokes when r is an io.Closer (a pipe). A plain
// blocking reader such as os.Stdin keeps it until EOF or process exit.
// A second goroutine owned by the transport writes w, so a Write whose
// context ends returns even when the writer blocks (a peer that stopped
// reading); Close provokes its end when w is an io.Closer that unblocks
// writes (a pipe). On a plain blocking file it keeps it until the write
// returns or the process exits.
type StdioTransport struct {
	r   io.Reader
	w   io.Writer
	max int

	startRead sync.Once
	lines     chan lineOrErr
	readerEnd chan struct{}

	startWrite sync.Once
	writes     chan writeReq
	writerEnd  chan struct{}

	closeOnce sync.Once
	closed    chan struct{}
}

type writeReq struct {
	b   []byte
	res chan error // buffered 1: a result nobody waits for is dropped
}

type lineOrErr struct {
	b   []byte
	err error
}

// NewStdioTransport reads messages from r and writes them to w.
func NewStdioTransport(r io.Reader, w io.Writer, opts *StdioOptions) *StdioTransport {
	max := DefaultMaxLineBytes
	if opts != nil && opts.MaxLineBytes > 0 {
		max = opts.MaxLineBytes
	}
	return &StdioTransport{
		r: r, w: w, max: max,
		lines:     make(chan lineOrErr),
		readerEnd: make(chan struct{}),
		writes:    make(chan writeReq),
		writerEnd: make(chan struct{}),
		closed:    make(chan struct{}),
	}
}

// Read returns the next non-blank line. io.EOF means the peer closed its
// end cleanly.
func (t *StdioTransport) Read(ctx context.Context) ([]byte, error) {
	t.startRead.Do(func() { go t.readLoop() })
	select {
	case l, ok := <-t.lines:
		if !ok {
			return nil, ErrClosed
		}
		return l.b, l.err
	case <-t.closed:
		return nil, ErrClosed
	case <-ctx.Done():
		return nil, context.Cause(ctx)
	}
}

func (t *StdioTransport) readLoop() {
	defer close(t.readerEnd)
	br := bufio.NewReaderSize(t.r, 64<<10)
	for {
		line, err := t.readLine(br)
		if err == nil {
			line = bytes.TrimSuffix(line, []byte("\r"))
			if len(bytes.TrimSpace(line)) == 0 {
				continue
			}
		}
		select {
		case t.lines <- lineOrErr{b: line, err: err}:
		case <-t.closed:
			return
		}
		if err != nil {
			return
		}
	}
}

// readLine reads up to the next newline, refusing lines past the limit. A
// last line without a newline before EOF still counts as a message.
func (t *StdioTransport) readLine(br *bufio.Reader) ([]byte, error) {
	var line []byte
	for {
		frag, err := br.ReadSlice('\n')
		if len(line)+len(frag) > t.max+1 { // +1: the newline itself
			return nil, fmt.Errorf("%w (%d bytes)", ErrLineTooLong, t.max)
		}
		line = append(line, frag...)
		switch {
		case err == nil:
			return line[:len(line)-1], nil
		case errors.Is(err, bufio.ErrBufferFull):
			continue
		case errors.Is(err, io.EOF) && len(bytes.TrimSpace(line)) > 0:
			return line, nil // the next call returns io.EOF
		default:
			return nil, err
		}
	}
}

// Write writes msg and a newline in one call. A message with raw newlines
// (pretty-printed JSON) is compacted first so it stays one line. It returns
// when ctx ends even if the write is stuck.
func (t *StdioTransport) Write(ctx context.Context, msg []byte) error {
	select {
	case <-t.closed:
		return ErrClosed
	default:
	}
	if err := ctx.Err(); err != nil {
		return context.Cause(ctx)
	}
	var buf bytes.Buffer
	if bytes.IndexByte(msg, '\n') >= 0 {
		if err := json.Compact(&buf, msg); err != nil {
			return fmt.Errorf("acp: stdio message with a newline is not valid JSON: %w", err)
		}
	} else {
		buf.Write(msg)
	}
	buf.WriteByte('\n')
	t.startWrite.Do(func() { go t.writeLoop() })
	req := writeReq{b: buf.Bytes(), res: make(chan error, 1)}
	select {
	case t.writes <- req:
	case <-t.closed:
		return ErrClosed
	case <-ctx.Done():
		return context.Cause(ctx)
	}
	select {
	case err := <-req.res:
		return err
	case <-t.closed:
		return ErrClosed
	case <-ctx.Done():
		return context.Cause(ctx)
	}
}

func (t *StdioTransport) writeLoop() {
	defer close(t.writerEnd)
	for {
		select {
		case req := <-t.writes:
			_, err := t.w.Write(req.b)
			req.res <- err
		case <-t.closed:
			return
		}
	}
}

// Close unblocks Read and closes the reader and writer when they are
// io.Closers. It is idempotent.
func (t *StdioTransport) Close() error {
	var err error
	t.closeOnce.Do(func() {
		close(t.closed)
		t.startRead.Do(func() { close(t.readerEnd) })  // never started
		t.startWrite.Do(func() { close(t.writerEnd) }) // never started
		if c, ok := t.r.(io.Closer); ok {
			err = c.Close()
		}
		if c, ok := t.w.(io.Closer); ok {
			err = errors.Join(err, c.Close())
		}
	})
	return err
}

// WriterDone is closed once the writing goroutine has returned, or at
// Close when it never started.
func (t *StdioTransport) WriterDone() <-chan struct{} { return t.writerEnd }

// ReaderDone is closed once the reading goroutine has returned, or at
// Close when it never started. Owners use it to join the goroutine.
func (t *StdioTransport) ReaderDone() <-chan struct{} { return t.readerEnd }
