package integration

import (
	"encoding/json"
	"io"
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

// fakeModel is an OpenAI-compatible chat completions server replaying the
// recorded SSE streams of agent/testdata, one per request, and keeping
// the request bodies.
type fakeModel struct {
	t       *testing.T
	srv     *httptest.Server
	mu      sync.Mutex
	streams []string
	bodies  []map[string]any
}

func startFakeModel(t *testing.T, streams ...string) *fakeModel {
	f := &fakeModel{t: t, streams: streams}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		var body map[string]any
		if err := json.Unmarshal(b, &body); err != nil {
			t.Errorf("model request is not JSON: %v", err)
		}
		f.mu.Lock()
		f.bodies = append(f.bodies, body)
		if len(f.streams) == 0 {
			f.mu.Unlock()
			t.Errorf("unexpected model request %s", b)
			http.Error(w, `{"error":{"message":"no stream left"}}`, http.StatusBadRequest)
			return
		}
		name := f.streams[0]
		f.streams = f.streams[1:]
		f.mu.Unlock()
		data, err := os.ReadFile(filepath.Join("..", "agent", "testdata", name))
		if err != nil {
			t.Errorf("read stream: %v", err)
			return
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.Write(data)
	}))
	t.Cleanup(func() {
		f.srv.CloseClientConnections()
		f.srv.Close()
	})
	return f
}

func (f *fakeModel) requests() []map[string]any {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]map[string]any(nil), f.bodies...)
}

// TestLLMToolCallEndToEnd: over a real WebSocket, a prompt makes the model
// call a tool on a real in-process MCP upstream (after the client allows
// it), the result goes back to the model and the answer streams to the
// client; session/load on a new connection replays the same updates, and
// the next prompt's model request carries the whole prior conversation.
func TestLLMToolCallEndToEnd(t *testing.T) {
	up := startUpstream(t, "up")
	model := startFakeModel(t, "e2e_whoami.sse", "e2e_answer.sse", "e2e_thanks.sse")
	s := startServerWith(t, serverOptions{
		Args: []string{"--model", "test-model", "--model-base-url", model.srv.URL + "/v1",
			"--model-api-key-env", "ACPSERVER_TEST_MODEL_KEY", "--permission-policy", "ask"},
		Env: []string{"ACPSERVER_TEST_MODEL_KEY=sk-e2e-secret"},
	})
	cwd := t.TempDir()
	servers := []map[string]any{httpServerEntry("up", up.url())}

	c := dial(t, s)
	c.initialize()
	var asked []message
	c.onRequest = func(m message) (any, *acp.Error) {
		if m.Method != acp.MethodRequestPermission {
			return nil, acp.Errorf(acp.CodeMethodNotFound, "unexpected %s", m.Method)
		}
		asked = append(asked, m)
		return map[string]any{"outcome": map[string]any{"outcome": "selected", "optionId": "allow_once"}}, nil
	}
	sid := c.newSession(cwd, servers...)
	stop, msgs := c.prompt(sid, "who are you?")
	if stop != acp.StopEndTurn {
		t.Fatalf("stop reason %q, want end_turn", stop)
	}
	if len(asked) != 1 {
		t.Fatalf("%d permission requests, want 1", len(asked))
	}
	live := rawUpdates(msgs)
	var kinds []string
	for _, m := range msgs {
		if m.Method != acp.MethodSessionUpdate {
			continue
		}
		_, kind, u := m.update()
		if st, ok := u["status"].(string); ok {
			kind += ":" + st
		}
		kinds = append(kinds, kind)
	}
	if status, text := toolOutcome(msgs); status != "completed" || text != "http:up" {
		t.Fatalf("tool outcome %q %q; updates %q", status, text, kinds)
	}
	if got := agentText(msgs); got != "Asking the upstream.The upstream says http:up." {
		t.Errorf("agent text %q", got)
	}
	if up.counts().inits == 0 {
		t.Errorf("the upstream was never used")
	}
	c.close()

	// A new connection loads the session: the replay is the user's prompt,
	// then exactly the updates the first client saw.
	c2 := dial(t, s)
	c2.initialize()
	replay := c2.mustCall("session/load", map[string]any{"sessionId": sid, "cwd": cwd, "mcpServers": servers}, nil)
	replayed := rawUpdates(replay)
	if len(replayed) != len(live)+1 {
		t.Fatalf("replayed %d updates, want %d (the prompt + %d)", len(replayed), len(live)+1, len(live))
	}
	if !strings.Contains(string(replayed[0]), `"user_message_chunk"`) || !strings.Contains(string(replayed[0]), "who are you?") {
		t.Errorf("first replayed update %s, want the user's prompt", replayed[0])
	}
	for i := range live {
		if !jsonEqual(live[i], replayed[i+1]) {
			t.Errorf("replayed update %d = %s, want %s", i, replayed[i+1], live[i])
		}
	}

	// The next prompt's model request carries the whole conversation.
	stop, msgs = c2.prompt(sid, "thanks")
	if stop != acp.StopEndTurn || agentText(msgs) != "You're welcome." {
		t.Fatalf("second turn: %q %q", stop, agentText(msgs))
	}
	reqs := model.requests()
	if len(reqs) != 3 {
		t.Fatalf("%d model requests, want 3", len(reqs))
	}
	conv, _ := json.Marshal(reqs[2]["messages"])
	wantConv := `[{"content":"who are you?","role":"user"},` +
		`{"content":"Asking the upstream.","role":"assistant","tool_calls":[{"function":{"arguments":"{}","name":"up__whoami"},"id":"call_w1","type":"function"}]},` +
		`{"content":"http:up","role":"tool","tool_call_id":"call_w1"},` +
		`{"content":"The upstream says http:up.","role":"assistant"},` +
		`{"content":"thanks","role":"user"}]`
	if string(conv) != wantConv {
		t.Errorf("third model request messages:\n got %s\nwant %s", conv, wantConv)
	}
	// It repeats the first turn's second request exactly.
	prev, _ := json.Marshal(reqs[1]["messages"])
	if !strings.HasPrefix(string(conv), strings.TrimSuffix(string(prev), "]")) {
		t.Errorf("rebuilt context differs from the live one:\nlive    %s\nrebuilt %s", prev, conv)
	}
	if strings.Contains(s.logs.String(), "sk-e2e-secret") {
		t.Errorf("the API key appears in the server log")
	}
	c2.close()
	s.waitIdle(t, 10*time.Second)
	up.waitBalanced(t, 5*time.Second)
}

func jsonEqual(a, b json.RawMessage) bool {
	var x, y any
	if json.Unmarshal(a, &x) != nil || json.Unmarshal(b, &y) != nil {
		return false
	}
	xa, _ := json.Marshal(x)
	ya, _ := json.Marshal(y)
	return string(xa) == string(ya)
}
