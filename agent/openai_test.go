package agent

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"
	"testing"

	"github.com/acpserver/acpserver/acp"
)

func TestOpenAIPlainText(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "text.sse"})
	a := llm.agent(t, OpenAIOptions{ContextWindow: 8192, MaxTokens: 256})
	s := newTestSession(t, newFakeTools())

	stop, err := s.prompt(context.Background(), a, "hi")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("Prompt = %q, %v; want end_turn", stop, err)
	}
	got := summary(s.updates())
	want := []string{"agent_message_chunk:Hello", "agent_message_chunk:, world.", "usage_update"}
	if !equalStrings(got, want) {
		t.Fatalf("updates = %q, want %q", got, want)
	}
	if u := s.updates()[2]; u["used"] != float64(16) || u["size"] != float64(8192) {
		t.Errorf("usage_update = %v, want used 16 size 8192", u)
	}
	reqs := llm.requests()
	if len(reqs) != 1 {
		t.Fatalf("%d model requests, want 1", len(reqs))
	}
	r := reqs[0]
	if r["model"] != "test-model" || r["stream"] != true || r["max_tokens"] != float64(256) {
		t.Errorf("request = %v", r)
	}
	if so, _ := r["stream_options"].(map[string]any); so["include_usage"] != true {
		t.Errorf("stream_options = %v, want include_usage", r["stream_options"])
	}
	if got := mustJSON(t, messages(r)); got != `[{"content":"hi","role":"user"}]` {
		t.Errorf("messages = %s", got)
	}
	tools, _ := r["tools"].([]any)
	if len(tools) != 2 || !strings.Contains(mustJSON(t, tools), `"name":"weather__get"`) {
		t.Errorf("tools = %s, want weather__get and slow__wait", mustJSON(t, tools))
	}
	if llm.auth[0] != "Bearer "+testAPIKey {
		t.Errorf("Authorization = %q", llm.auth[0])
	}
}

func TestOpenAIToolCallSplitArguments(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "tool_split.sse"}, reply{file: "answer.sse"})
	a := llm.agent(t, OpenAIOptions{Permission: PolicyAllowAll})
	tools := newFakeTools()
	s := newTestSession(t, tools)

	stop, err := s.prompt(context.Background(), a, "weather in Paris?")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("Prompt = %q, %v; want end_turn", stop, err)
	}
	got := summary(s.updates())
	want := []string{
		"agent_message_chunk:Let me check.",
		"tool_call:pending",
		"tool_call_update:in_progress",
		"tool_call_update:completed:sunny in Paris",
		"agent_message_chunk:It is sunny",
		"agent_message_chunk: in Paris.",
	}
	if !equalStrings(got, want) {
		t.Fatalf("updates = %q, want %q", got, want)
	}
	call := s.updates()[1]
	if call["toolCallId"] != "tc1:call_abc" || call["title"] != "weather/get" || mustJSON(t, call["rawInput"]) != `{"city":"Paris"}` {
		t.Errorf("tool_call = %v", call)
	}
	if c := tools.called(); len(c) != 1 || c[0] != `weather/get {"city":"Paris"}` {
		t.Errorf("tool calls = %q", c)
	}
	reqs := llm.requests()
	if len(reqs) != 2 {
		t.Fatalf("%d model requests, want 2", len(reqs))
	}
	msgs := mustJSON(t, messages(reqs[1]))
	want2 := `[{"content":"weather in Paris?","role":"user"},` +
		`{"content":"Let me check.","role":"assistant","tool_calls":[{"function":{"arguments":"{\"city\":\"Paris\"}","name":"weather__get"},"id":"call_abc","type":"function"}]},` +
		`{"content":"sunny in Paris","role":"tool","tool_call_id":"call_abc"}]`
	if msgs != want2 {
		t.Errorf("second request messages:\n got %s\nwant %s", msgs, want2)
	}
}

func TestOpenAIParallelToolCalls(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "parallel.sse"}, reply{file: "answer.sse"})
	a := llm.agent(t, OpenAIOptions{Permission: PolicyAllowAll})
	tools := newFakeTools()
	tools.meet = make(chan struct{}) // each call waits for the other
	s := newTestSession(t, tools)

	stop, err := s.prompt(context.Background(), a, "weather in Oslo and Rome?")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("Prompt = %q, %v; want end_turn", stop, err)
	}
	ups := s.updates()
	if got := summary(ups[:2]); !equalStrings(got, []string{"tool_call:pending", "tool_call:pending"}) {
		t.Fatalf("first updates = %q, want both calls announced first", got)
	}
	final := map[string]string{}
	for _, u := range ups {
		if u["sessionUpdate"] == "tool_call_update" && u["status"] == "completed" {
			final[u["toolCallId"].(string)] = summary([]map[string]any{u})[0]
		}
	}
	if final["tc1:call_p1"] != "tool_call_update:completed:sunny in Oslo" || final["tc2:call_p2"] != "tool_call_update:completed:sunny in Rome" {
		t.Errorf("final updates = %v", final)
	}
	msgs := mustJSON(t, messages(llm.requests()[1]))
	for _, frag := range []string{
		`"tool_calls":[{"function":{"arguments":"{\"city\":\"Oslo\"}","name":"weather__get"},"id":"call_p1","type":"function"},{"function":{"arguments":"{\"city\":\"Rome\"}","name":"weather__get"},"id":"call_p2","type":"function"}]`,
		`{"content":"sunny in Oslo","role":"tool","tool_call_id":"call_p1"},{"content":"sunny in Rome","role":"tool","tool_call_id":"call_p2"}`,
	} {
		if !strings.Contains(msgs, frag) {
			t.Errorf("second request lacks %s\nin %s", frag, msgs)
		}
	}
}

func TestOpenAIReasoning(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "reasoning.sse"})
	a := llm.agent(t, OpenAIOptions{})
	s := newTestSession(t, nil)
	stop, err := s.prompt(context.Background(), a, "hello")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("Prompt = %q, %v", stop, err)
	}
	want := []string{
		"agent_thought_chunk:The user greets me.",
		"agent_thought_chunk: I should greet back.",
		"agent_message_chunk:Hi!",
		"usage_update",
	}
	if got := summary(s.updates()); !equalStrings(got, want) {
		t.Fatalf("updates = %q, want %q", got, want)
	}
	if _, ok := llm.requests()[0]["tools"]; ok {
		t.Errorf("request without tools carries a tools field")
	}
}

func TestOpenAIRetry429ThenSuccess(t *testing.T) {
	llm := newFakeLLM(t, reply{status: http.StatusTooManyRequests}, reply{file: "text.sse"})
	a := llm.agent(t, OpenAIOptions{Retries: 2})
	s := newTestSession(t, nil)
	stop, err := s.prompt(context.Background(), a, "hi")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("Prompt = %q, %v", stop, err)
	}
	if n := len(llm.requests()); n != 2 {
		t.Errorf("%d requests, want 2 (one retry)", n)
	}
	if got := summary(s.updates()); len(got) == 0 || got[0] != "agent_message_chunk:Hello" {
		t.Errorf("updates = %q", got)
	}
}

func TestOpenAI500Exhausted(t *testing.T) {
	llm := newFakeLLM(t,
		reply{status: 500}, reply{status: 502}, reply{status: 503},
		reply{file: "text.sse"})
	log, logs := logBuffer()
	a := llm.agent(t, OpenAIOptions{Retries: 2, Logger: log})
	s := newTestSession(t, nil)
	stop, err := s.prompt(context.Background(), a, "hi")
	if err == nil {
		t.Fatalf("Prompt = %q, nil error; want a failure after the retries", stop)
	}
	if !strings.Contains(err.Error(), "503") {
		t.Errorf("error %q does not name the last status", err)
	}
	if n := len(llm.requests()); n != 3 {
		t.Errorf("%d requests, want 3 (1 + 2 retries)", n)
	}
	if !strings.Contains(logs.String(), `"session_id":"sess-1"`) {
		t.Errorf("failure not logged with session_id: %s", logs)
	}
	if strings.Contains(logs.String(), testAPIKey) || strings.Contains(err.Error(), testAPIKey) {
		t.Errorf("API key leaked into logs or errors")
	}
	// The session stays usable.
	stop, err = s.prompt(context.Background(), a, "again")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("next Prompt = %q, %v", stop, err)
	}
}

func TestOpenAITruncatedStream(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "truncated.sse"}, reply{file: "text.sse"})
	a := llm.agent(t, OpenAIOptions{})
	s := newTestSession(t, nil)
	stop, err := s.prompt(context.Background(), a, "what is the answer?")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("Prompt = %q, %v", stop, err)
	}
	got := summary(s.updates())
	if len(got) != 3 || got[0] != "agent_message_chunk:The answer is" || !strings.Contains(got[2], "cut off") {
		t.Fatalf("updates = %q, want the partial text then a cut-off notice", got)
	}
	stop, err = s.prompt(context.Background(), a, "go on")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("next Prompt = %q, %v", stop, err)
	}
	// The partial answer and the notice are part of the next context.
	msgs := messages(llm.requests()[1])
	if len(msgs) != 3 || !strings.Contains(mustJSON(t, msgs[1]), "The answer is forty") {
		t.Errorf("next request messages = %s", mustJSON(t, msgs))
	}
}

func TestOpenAIUnknownTool(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "unknown_tool.sse"}, reply{file: "sorry.sse"})
	a := llm.agent(t, OpenAIOptions{}) // policy ask: an unknown tool is never asked about
	tools := newFakeTools()
	s := newTestSession(t, tools)
	stop, err := s.prompt(context.Background(), a, "delete everything")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("Prompt = %q, %v", stop, err)
	}
	got := summary(s.updates())
	if len(got) != 3 || got[0] != "tool_call:pending" || !strings.HasPrefix(got[1], `tool_call_update:failed:error: unknown tool "files__delete"; available tools: slow__wait, weather__get`) {
		t.Fatalf("updates = %q", got)
	}
	if len(s.asked) != 0 || len(tools.called()) != 0 {
		t.Errorf("unknown tool was asked about (%d) or called (%q)", len(s.asked), tools.called())
	}
	msgs := mustJSON(t, messages(llm.requests()[1]))
	if !strings.Contains(msgs, `"content":"error: unknown tool \"files__delete\"`) || !strings.Contains(msgs, `"tool_call_id":"call_u1"`) {
		t.Errorf("model was not told about the unknown tool: %s", msgs)
	}
}

func TestOpenAIMalformedArguments(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "malformed_args.sse"}, reply{file: "sorry.sse"}, reply{file: "tool_split.sse"}, reply{file: "answer.sse"})
	a := llm.agent(t, OpenAIOptions{Permission: PolicyAllowAll})
	tools := newFakeTools()
	s := newTestSession(t, tools)
	stop, err := s.prompt(context.Background(), a, "weather?")
	if err != nil || stop != acp.StopEndTurn {
		t.Fatalf("Prompt = %q, %v", stop, err)
	}
	ups := s.updates()
	got := summary(ups)
	if len(got) < 2 || !strings.HasPrefix(got[1], "tool_call_update:failed:error: the arguments are not a valid JSON object") {
		t.Fatalf("updates = %q", got)
	}
	if ups[0]["rawInput"] != `{"city": "Pa` {
		t.Errorf("rawInput = %#v, want the broken text verbatim", ups[0]["rawInput"])
	}
	if len(tools.called()) != 0 {
		t.Errorf("tool called with broken arguments: %q", tools.called())
	}
	// The session stays usable, and the next turn's context replays the
	// broken call exactly.
	if stop, err := s.prompt(context.Background(), a, "try again"); err != nil || stop != acp.StopEndTurn {
		t.Fatalf("next Prompt = %q, %v", stop, err)
	}
	reqs := llm.requests()
	first := mustJSON(t, messages(reqs[1]))
	second := mustJSON(t, messages(reqs[2]))
	if !strings.HasPrefix(second, strings.TrimSuffix(first, "]")) {
		t.Errorf("rebuilt context differs:\nturn 1: %s\nturn 2: %s", first, second)
	}
}

func TestOpenAICancelMidStream(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "hold.sse"})
	a := llm.agent(t, OpenAIOptions{})
	s := newTestSession(t, nil)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-llm.held
		cancel()
	}()
	stop, err := s.prompt(ctx, a, "think")
	if err != nil || stop != acp.StopCancelled {
		t.Fatalf("Prompt = %q, %v; want cancelled", stop, err)
	}
	// goleak (TestMain) checks the stream's goroutines are gone.
}

func TestOpenAICancelMidToolCall(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "slow_tool.sse"})
	a := llm.agent(t, OpenAIOptions{Permission: PolicyAllowAll})
	tools := newFakeTools()
	s := newTestSession(t, tools)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-tools.started
		cancel()
	}()
	stop, err := s.prompt(ctx, a, "wait")
	if err != nil || stop != acp.StopCancelled {
		t.Fatalf("Prompt = %q, %v; want cancelled", stop, err)
	}
	want := []string{"tool_call:pending", "tool_call_update:in_progress", "tool_call_update:failed:cancelled"}
	if got := summary(s.updates()); !equalStrings(got, want) {
		t.Fatalf("updates = %q, want %q", got, want)
	}
	if n := len(llm.requests()); n != 1 {
		t.Errorf("%d model requests after cancel, want 1", n)
	}
}

func TestOpenAICancelWhileAsking(t *testing.T) {
	llm := newFakeLLM(t, reply{file: "tool_split.sse"})
	a := llm.agent(t, OpenAIOptions{})
	s := newTestSession(t, newFakeTools())
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s.answer = func(acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error) {
		cancel() // the peer withdraws the request when its ctx ends
		return acp.RequestPermissionResponse{}, context.Canceled
	}
	stop, err := s.prompt(ctx, a, "weather")
	if err != nil || stop != acp.StopCancelled {
		t.Fatalf("Prompt = %q, %v; want cancelled", stop, err)
	}
	got := summary(s.updates())
	if got[len(got)-1] != "tool_call_update:failed:cancelled" {
		t.Errorf("updates = %q, want the call to end failed/cancelled", got)
	}
}

func TestOpenAIPermissions(t *testing.T) {
	t.Run("allow always is remembered for the session", func(t *testing.T) {
		llm := newFakeLLM(t,
			reply{file: "tool_split.sse"}, reply{file: "answer.sse"},
			reply{file: "tool_split.sse"}, reply{file: "answer.sse"})
		a := llm.agent(t, OpenAIOptions{Permission: PolicyAsk})
		tools := newFakeTools()
		s := newTestSession(t, tools)
		s.answer = selectOption("allow_always")
		for i := range 2 {
			if stop, err := s.prompt(context.Background(), a, "weather"); err != nil || stop != acp.StopEndTurn {
				t.Fatalf("turn %d: Prompt = %q, %v", i, stop, err)
			}
		}
		if len(s.asked) != 1 {
			t.Fatalf("asked %d times, want once", len(s.asked))
		}
		req := s.asked[0]
		if req.SessionID != "sess-1" || req.ToolCall.ToolCallID != "tc1:call_abc" || *req.ToolCall.Title != "weather/get" {
			t.Errorf("permission request = %+v", req)
		}
		var kinds []string
		for _, o := range req.Options {
			kinds = append(kinds, o.Kind)
		}
		if !equalStrings(kinds, []string{"allow_once", "allow_always", "reject_once"}) {
			t.Errorf("options = %q", kinds)
		}
		if len(tools.called()) != 2 {
			t.Errorf("tool ran %d times, want 2", len(tools.called()))
		}
		// A new runtime (fresh State) asks again.
		s.state = &SessionState{}
		llm.mu.Lock()
		llm.replies = append(llm.replies, reply{file: "tool_split.sse"}, reply{file: "answer.sse"})
		llm.mu.Unlock()
		if _, err := s.prompt(context.Background(), a, "weather"); err != nil {
			t.Fatal(err)
		}
		if len(s.asked) != 2 {
			t.Errorf("asked %d times after a new runtime, want 2", len(s.asked))
		}
	})
	t.Run("allow once asks every time", func(t *testing.T) {
		llm := newFakeLLM(t,
			reply{file: "tool_split.sse"}, reply{file: "answer.sse"},
			reply{file: "tool_split.sse"}, reply{file: "answer.sse"})
		a := llm.agent(t, OpenAIOptions{})
		s := newTestSession(t, newFakeTools())
		s.answer = selectOption("allow_once")
		for range 2 {
			if _, err := s.prompt(context.Background(), a, "weather"); err != nil {
				t.Fatal(err)
			}
		}
		if len(s.asked) != 2 {
			t.Errorf("asked %d times, want 2", len(s.asked))
		}
	})
	t.Run("reject is reported to the model as rejected", func(t *testing.T) {
		llm := newFakeLLM(t, reply{file: "tool_split.sse"}, reply{file: "sorry.sse"})
		a := llm.agent(t, OpenAIOptions{})
		tools := newFakeTools()
		s := newTestSession(t, tools)
		s.answer = selectOption("reject_once")
		stop, err := s.prompt(context.Background(), a, "weather")
		if err != nil || stop != acp.StopEndTurn {
			t.Fatalf("Prompt = %q, %v", stop, err)
		}
		if len(tools.called()) != 0 {
			t.Errorf("rejected tool ran")
		}
		got := summary(s.updates())
		if !equalStrings(got[1:3], []string{"tool_call:pending", "tool_call_update:failed:the user rejected this tool call"}) {
			t.Errorf("updates = %q", got)
		}
		msgs := mustJSON(t, messages(llm.requests()[1]))
		if !strings.Contains(msgs, `{"content":"the user rejected this tool call","role":"tool","tool_call_id":"call_abc"}`) {
			t.Errorf("second request = %s", msgs)
		}
	})
	t.Run("allow-list skips asking", func(t *testing.T) {
		llm := newFakeLLM(t, reply{file: "tool_split.sse"}, reply{file: "answer.sse"})
		a := llm.agent(t, OpenAIOptions{AllowTools: []string{"weather/get"}})
		tools := newFakeTools()
		s := newTestSession(t, tools)
		if _, err := s.prompt(context.Background(), a, "weather"); err != nil {
			t.Fatal(err)
		}
		if len(s.asked) != 0 || len(tools.called()) != 1 {
			t.Errorf("asked %d, called %d; want 0, 1", len(s.asked), len(tools.called()))
		}
	})
}

func TestOpenAIHistoryRebuild(t *testing.T) {
	llm := newFakeLLM(t,
		reply{file: "tool_split.sse"}, reply{file: "answer.sse"},
		reply{file: "parallel.sse"}, reply{file: "answer.sse"},
		reply{file: "text.sse"})
	a := llm.agent(t, OpenAIOptions{Permission: PolicyAllowAll, SystemPrompt: "be brief"})
	s := newTestSession(t, newFakeTools())
	for _, p := range []string{"weather in Paris?", "and Oslo, Rome?", "thanks"} {
		if stop, err := s.prompt(context.Background(), a, p); err != nil || stop != acp.StopEndTurn {
			t.Fatalf("%q: Prompt = %q, %v", p, stop, err)
		}
	}
	reqs := llm.requests()
	if len(reqs) != 5 {
		t.Fatalf("%d requests, want 5", len(reqs))
	}
	// Each turn's first request is the previous turn's last request, plus
	// the final answer, plus the new prompt: the rebuild is exact.
	for _, pair := range [][2]int{{1, 2}, {3, 4}} {
		prev, next := messages(reqs[pair[0]]), messages(reqs[pair[1]])
		if len(next) != len(prev)+2 {
			t.Fatalf("request %d has %d messages, want %d", pair[1], len(next), len(prev)+2)
		}
		if got, want := mustJSON(t, next[:len(prev)]), mustJSON(t, prev); got != want {
			t.Errorf("request %d does not carry the conversation exactly:\n got %s\nwant %s", pair[1], got, want)
		}
		if got := mustJSON(t, next[len(prev)]); got != `{"content":"It is sunny in Paris.","role":"assistant"}` {
			t.Errorf("final answer rebuilt as %s", got)
		}
	}
	last := mustJSON(t, messages(reqs[4]))
	if !strings.HasPrefix(last, `[{"content":"be brief","role":"system"},{"content":"weather in Paris?","role":"user"}`) ||
		!strings.Contains(last, `"tool_call_id":"call_p2"`) || !strings.HasSuffix(last, `{"content":"thanks","role":"user"}]`) {
		t.Errorf("last request = %s", last)
	}
	// Tool call ids stay unique across turns.
	seen := map[string]bool{}
	for _, raw := range s.history {
		var e histEntry
		_ = json.Unmarshal(raw, &e)
		if e.SessionUpdate == acp.UpdateToolCall {
			if seen[e.ToolCallID] {
				t.Errorf("toolCallId %q repeats", e.ToolCallID)
			}
			seen[e.ToolCallID] = true
		}
	}
	if len(seen) != 3 {
		t.Errorf("%d tool calls recorded, want 3", len(seen))
	}
}

func TestOpenAIStopReasons(t *testing.T) {
	for _, tc := range []struct {
		name    string
		replies []reply
		opts    OpenAIOptions
		want    acp.StopReason
	}{
		{"length", []reply{{file: "length.sse"}}, OpenAIOptions{}, acp.StopMaxTokens},
		{"refusal", []reply{{file: "refusal.sse"}}, OpenAIOptions{}, acp.StopRefusal},
		{"max turn requests", []reply{{file: "tool_split.sse"}}, OpenAIOptions{MaxTurnRequests: 1, Permission: PolicyAllowAll}, acp.StopMaxTurnRequests},
	} {
		t.Run(tc.name, func(t *testing.T) {
			llm := newFakeLLM(t, tc.replies...)
			a := llm.agent(t, tc.opts)
			s := newTestSession(t, newFakeTools())
			stop, err := s.prompt(context.Background(), a, "go")
			if err != nil || stop != tc.want {
				t.Fatalf("Prompt = %q, %v; want %q", stop, err, tc.want)
			}
		})
	}
}

func TestFuncName(t *testing.T) {
	for in, want := range map[string]string{
		"weather/get":  "weather__get",
		"my.server/do": "my_server__do",
		"valid_name-1": "valid_name-1",
		"":             "tool",
	} {
		if got := funcName(in); got != want {
			t.Errorf("funcName(%q) = %q, want %q", in, got, want)
		}
	}
	long := funcName(strings.Repeat("x", 100) + "/y")
	if len(long) != 64 || funcName(long) != long {
		t.Errorf("long name %q (len %d) not shortened to a fixed point", long, len(long))
	}
}
