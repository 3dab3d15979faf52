package agent

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/acpserver/acpserver/acp"
)

const testAPIKey = "sk-test-secret-never-logged"

// reply is one scripted answer of the fake model server.
type reply struct {
	status int    // 0 means 200 with the SSE file
	file   string // under testdata/
}

// fakeLLM is an OpenAI-compatible chat completions server that replays
// recorded SSE streams, one reply per request, and records the requests.
// A "#HOLD" line in a stream file holds the response there until the
// client goes away.
type fakeLLM struct {
	t   *testing.T
	srv *httptest.Server

	mu      sync.Mutex
	replies []reply
	bodies  [][]byte
	auth    []string
	held    chan struct{} // closed when a response reaches #HOLD
}

func newFakeLLM(t *testing.T, replies ...reply) *fakeLLM {
	t.Helper()
	f := &fakeLLM{t: t, replies: replies, held: make(chan struct{})}
	f.srv = httptest.NewServer(http.HandlerFunc(f.serve))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeLLM) serve(w http.ResponseWriter, r *http.Request) {
	body, _ := io.ReadAll(r.Body)
	f.mu.Lock()
	f.bodies = append(f.bodies, body)
	f.auth = append(f.auth, r.Header.Get("Authorization"))
	if r.URL.Path != "/v1/chat/completions" || len(f.replies) == 0 {
		f.mu.Unlock()
		f.t.Errorf("unexpected request %s %s (replies left: 0)", r.Method, r.URL.Path)
		http.Error(w, `{"error":{"message":"unexpected request"}}`, http.StatusBadRequest)
		return
	}
	rep := f.replies[0]
	f.replies = f.replies[1:]
	f.mu.Unlock()

	if rep.status != 0 && rep.status != http.StatusOK {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(rep.status)
		fmt.Fprintf(w, `{"error":{"message":"scripted %d","type":"server_error","code":null,"param":null}}`, rep.status)
		return
	}
	data, err := os.ReadFile(filepath.Join("testdata", rep.file))
	if err != nil {
		f.t.Errorf("read stream: %v", err)
		return
	}
	w.Header().Set("Content-Type", "text/event-stream")
	before, _, hold := bytes.Cut(data, []byte("#HOLD\n"))
	w.Write(before)
	w.(http.Flusher).Flush()
	if hold {
		close(f.held)
		<-r.Context().Done()
	}
}

// requests returns the decoded request bodies so far.
func (f *fakeLLM) requests() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	out := make([]map[string]any, 0, len(f.bodies))
	for _, b := range f.bodies {
		var m map[string]any
		if err := json.Unmarshal(b, &m); err != nil {
			f.t.Fatalf("request body is not JSON: %v", err)
		}
		out = append(out, m)
	}
	return out
}

func (f *fakeLLM) agent(t *testing.T, opts OpenAIOptions) *OpenAI {
	t.Helper()
	opts.Model = "test-model"
	opts.BaseURL = f.srv.URL + "/v1"
	opts.APIKey = testAPIKey
	opts.HTTPClient = f.srv.Client()
	if opts.RetryMaxDelay == 0 {
		opts.RetryMaxDelay = time.Millisecond // keep retry tests quick; not asserted
	}
	a, err := NewOpenAI(opts)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { a.Close() })
	return a
}

// testSession plays sessionmgr's part: it records every update into the
// history (user chunks of the prompt first) and answers permission
// requests.
type testSession struct {
	t     *testing.T
	id    string
	tools Toolset
	state *SessionState

	mu      sync.Mutex
	history []json.RawMessage
	turn    []json.RawMessage // updates of the running turn
	asked   []acp.RequestPermissionRequest
	answer  func(acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error)
	onUpd   func(u map[string]any)
}

func newTestSession(t *testing.T, tools Toolset) *testSession {
	return &testSession{t: t, id: "sess-1", tools: tools, state: &SessionState{}}
}

func (s *testSession) prompt(ctx context.Context, a Agent, text string) (acp.StopReason, error) {
	s.t.Helper()
	blocks := []acp.ContentBlock{acp.TextBlock(text)}
	s.mu.Lock()
	hist := append([]json.RawMessage(nil), s.history...)
	for _, b := range blocks {
		raw, _ := json.Marshal(acp.UserChunk(b))
		s.history = append(s.history, raw)
	}
	s.turn = nil
	s.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second) // watchdog, not a speed bound
	defer cancel()
	return a.Prompt(ctx, &Turn{
		SessionID: s.id,
		Prompt:    blocks,
		History:   hist,
		Tools:     s.tools,
		State:     s.state,
		Update: func(u any) error {
			raw, err := json.Marshal(u)
			if err != nil {
				return err
			}
			s.mu.Lock()
			s.history = append(s.history, raw)
			s.turn = append(s.turn, raw)
			hook := s.onUpd
			s.mu.Unlock()
			if hook != nil {
				var m map[string]any
				_ = json.Unmarshal(raw, &m)
				hook(m)
			}
			return nil
		},
		RequestPermission: func(ctx context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
			s.mu.Lock()
			s.asked = append(s.asked, req)
			answer := s.answer
			s.mu.Unlock()
			if answer == nil {
				return acp.RequestPermissionResponse{}, errors.New("no permission answer scripted")
			}
			return answer(req)
		},
	})
}

// updates returns the running (or last) turn's updates, decoded.
func (s *testSession) updates() []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]map[string]any, 0, len(s.turn))
	for _, raw := range s.turn {
		var m map[string]any
		_ = json.Unmarshal(raw, &m)
		out = append(out, m)
	}
	return out
}

// summary renders updates compactly: "kind[:status][:text]" per update.
func summary(updates []map[string]any) []string {
	var out []string
	for _, u := range updates {
		s := fmt.Sprint(u["sessionUpdate"])
		if st, ok := u["status"]; ok {
			s += ":" + fmt.Sprint(st)
		}
		if c, ok := u["content"].(map[string]any); ok {
			s += ":" + fmt.Sprint(c["text"])
		}
		if cs, ok := u["content"].([]any); ok {
			for _, c := range cs {
				s += ":" + fmt.Sprint(c.(map[string]any)["content"].(map[string]any)["text"])
			}
		}
		out = append(out, s)
	}
	return out
}

func selectOption(id string) func(acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
	return func(acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		var r acp.RequestPermissionResponse
		r.Outcome.Outcome = "selected"
		r.Outcome.OptionID = id
		return r, nil
	}
}

// fakeTools is a plain Go toolset: weather/get answers from its city
// argument, slow/wait blocks until cancelled, and barrier/meet waits for
// a second concurrent call.
type fakeTools struct {
	mu      sync.Mutex
	calls   []string
	started chan string
	meet    chan struct{}
}

func newFakeTools() *fakeTools {
	return &fakeTools{started: make(chan string, 16)}
}

func (f *fakeTools) Tools() []Tool {
	return []Tool{
		{Name: "weather/get", Description: "Weather for a city", InputSchema: json.RawMessage(`{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}`)},
		{Name: "slow/wait", Description: "Waits until cancelled"},
	}
}

func (f *fakeTools) CallTool(ctx context.Context, name string, args json.RawMessage) (ToolResult, error) {
	f.mu.Lock()
	f.calls = append(f.calls, name+" "+string(args))
	meet := f.meet
	f.mu.Unlock()
	f.started <- name
	switch name {
	case "weather/get":
		var a struct{ City string }
		if err := json.Unmarshal(args, &a); err != nil {
			return ToolResult{}, err
		}
		if meet != nil {
			// Parallel test: both calls must be in flight at once.
			select {
			case meet <- struct{}{}:
			case <-meet:
			case <-ctx.Done():
				return ToolResult{}, ctx.Err()
			}
		}
		return ToolResult{Content: []acp.ContentBlock{acp.TextBlock("sunny in " + a.City)}}, nil
	case "slow/wait":
		<-ctx.Done()
		return ToolResult{}, ctx.Err()
	}
	return ToolResult{}, fmt.Errorf("no tool %q", name)
}

func (f *fakeTools) called() []string {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]string(nil), f.calls...)
}

// messages is the "messages" array of a request body.
func messages(req map[string]any) []any {
	m, _ := req["messages"].([]any)
	return m
}

func mustJSON(t *testing.T, v any) string {
	t.Helper()
	b, err := json.Marshal(v)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

func equalStrings(a, b []string) bool {
	return strings.Join(a, "\x00") == strings.Join(b, "\x00")
}

// logBuffer is a slog logger writing JSON into a buffer.
func logBuffer() (*slog.Logger, *syncBuffer) {
	var b syncBuffer
	return slog.New(slog.NewJSONHandler(&b, &slog.HandlerOptions{Level: slog.LevelDebug})), &b
}

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}
