package agent

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"strings"
	"sync"
	"time"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/option"

	"github.com/acpserver/acpserver/acp"
)

// PermissionPolicy says when a tool call needs the client's approval.
type PermissionPolicy string

// Permission policies.
const (
	// PolicyAsk asks the client about every tool call not on the
	// allow-list and not allowed "always" earlier in the session.
	PolicyAsk PermissionPolicy = "ask"
	// PolicyAllowAll runs every tool call without asking.
	PolicyAllowAll PermissionPolicy = "allow-all"
)

// Defaults of OpenAIOptions.
const (
	DefaultOpenAIBaseURL   = "https://api.openai.com/v1"
	DefaultModelTimeout    = 5 * time.Minute
	DefaultMaxTurnRequests = 25
	DefaultModelRetries    = 2
	DefaultRetryMaxDelay   = 8 * time.Second
)

// OpenAIOptions configures an OpenAI-compatible chat completions agent.
// Zero fields take the defaults above.
type OpenAIOptions struct {
	// Model is the model name sent with every request. Required.
	Model string
	// BaseURL is the API root, e.g. http://127.0.0.1:11434/v1 for Ollama.
	BaseURL string
	// APIKey is sent as a bearer token when not empty. It is never logged.
	APIKey string
	// Timeout bounds one model request attempt, streaming included.
	Timeout time.Duration
	// MaxTokens caps each model response (max_tokens); 0 leaves it to the
	// server.
	MaxTokens int64
	// MaxTurnRequests bounds the model requests of one prompt turn; past
	// it the turn stops with max_turn_requests.
	MaxTurnRequests int
	// Retries is how often a request answered 408, 409, 429 or 5xx, or
	// failing to connect, is retried with exponential backoff. Negative
	// means no retries; zero means DefaultModelRetries.
	Retries int
	// RetryMaxDelay caps one backoff wait (and a server's Retry-After).
	RetryMaxDelay time.Duration
	// Permission is PolicyAsk (default) or PolicyAllowAll.
	Permission PermissionPolicy
	// AllowTools are SERVER/TOOL names that run without asking.
	AllowTools []string
	// SystemPrompt, when set, opens every request as a system message.
	SystemPrompt string
	// ContextWindow is the model's context size in tokens, reported as the
	// size of usage_update; 0 reports 0 (unknown).
	ContextWindow uint64
	// HTTPClient sends the requests; nil means a client with a transport
	// of its own.
	HTTPClient *http.Client
	// Logger gets warnings; nil discards.
	Logger *slog.Logger
}

// OpenAI is an agent backed by an OpenAI-compatible chat completions API
// (OpenAI, Ollama, llama.cpp, vLLM, ...). It streams the answer, calls the
// session's tools (in parallel when the model asks for several), and loops
// until the model stops. It keeps no per-session state of its own: what
// must outlive a turn lives in Turn.History and Turn.State.
type OpenAI struct {
	opts   OpenAIOptions
	client openai.Client
	allow  map[string]bool
	log    *slog.Logger
}

// NewOpenAI checks opts and returns the agent.
func NewOpenAI(opts OpenAIOptions) (*OpenAI, error) {
	if strings.TrimSpace(opts.Model) == "" {
		return nil, errors.New("openai agent: a model name is required")
	}
	if opts.BaseURL == "" {
		opts.BaseURL = DefaultOpenAIBaseURL
	}
	if opts.Timeout <= 0 {
		opts.Timeout = DefaultModelTimeout
	}
	if opts.MaxTurnRequests <= 0 {
		opts.MaxTurnRequests = DefaultMaxTurnRequests
	}
	switch {
	case opts.Retries == 0:
		opts.Retries = DefaultModelRetries
	case opts.Retries < 0:
		opts.Retries = 0
	}
	if opts.RetryMaxDelay <= 0 {
		opts.RetryMaxDelay = DefaultRetryMaxDelay
	}
	switch opts.Permission {
	case "":
		opts.Permission = PolicyAsk
	case PolicyAsk, PolicyAllowAll:
	default:
		return nil, fmt.Errorf("openai agent: unknown permission policy %q (want %q or %q)", opts.Permission, PolicyAsk, PolicyAllowAll)
	}
	log := opts.Logger
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	ropts := []option.RequestOption{
		option.WithBaseURL(opts.BaseURL),
		// Always set, even empty: never fall back to OPENAI_API_KEY when
		// the operator named another variable.
		option.WithAPIKey(opts.APIKey),
		option.WithMaxRetries(opts.Retries),
		option.WithMaxRetryDelay(opts.RetryMaxDelay),
		option.WithRequestTimeout(opts.Timeout),
	}
	if opts.HTTPClient == nil {
		// A transport of its own, so Close can release its connections.
		opts.HTTPClient = &http.Client{Transport: http.DefaultTransport.(*http.Transport).Clone()}
	}
	ropts = append(ropts, option.WithHTTPClient(opts.HTTPClient))
	a := &OpenAI{
		opts:   opts,
		client: openai.NewClient(ropts...),
		allow:  make(map[string]bool, len(opts.AllowTools)),
		log:    log,
	}
	for _, name := range opts.AllowTools {
		a.allow[name] = true
	}
	return a, nil
}

// Prompt runs one turn: it rebuilds the conversation from t.History, then
// alternates model requests and tool calls until the model stops.
//
// Stop reasons: end_turn when the model finishes (or its stream breaks off,
// see below); max_tokens on finish_reason "length"; refusal on
// "content_filter" or a refusal; max_turn_requests when the bound of model
// requests is reached; cancelled once ctx ends, after every announced tool
// call has its final update.
//
// A stream that ends without a finish_reason (a dropped connection, a
// crashed server) is reported to the client as an agent message saying the
// answer is incomplete, and the turn ends end_turn: what streamed so far
// stays in the history and the session stays usable. A request that fails
// after its retries ends the turn with an error response.
func (a *OpenAI) Prompt(ctx context.Context, t *Turn) (acp.StopReason, error) {
	r := &openaiRun{a: a, t: t}
	r.tools = newToolIndex(t.Tools)
	hist := rebuildHistory(t.History, r.tools)
	r.ordinal = hist.toolCalls
	if a.opts.SystemPrompt != "" {
		r.messages = append(r.messages, openai.SystemMessage(a.opts.SystemPrompt))
	}
	r.messages = append(r.messages, hist.messages...)
	r.messages = append(r.messages, openai.UserMessage(promptText(t.Prompt)))
	return r.loop(ctx)
}

// openaiRun is one turn in flight.
type openaiRun struct {
	a        *OpenAI
	t        *Turn
	tools    *toolIndex
	messages []openai.ChatCompletionMessageParamUnion
	ordinal  int // tool calls in the session so far, for unique ids

	mu      sync.Mutex // serializes t.Update: parallel tool calls report concurrently
	allowed map[string]bool
}

func (r *openaiRun) update(u any) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.t.Update(u)
}

func (r *openaiRun) loop(ctx context.Context) (acp.StopReason, error) {
	log := r.a.log.With("session_id", r.t.SessionID)
	for n := 0; ; n++ {
		if ctx.Err() != nil {
			return acp.StopCancelled, nil
		}
		if n >= r.a.opts.MaxTurnRequests {
			return acp.StopMaxTurnRequests, nil
		}
		res, err := r.stream(ctx)
		if ctx.Err() != nil {
			return acp.StopCancelled, nil
		}
		if err != nil {
			var uerr *updateError
			if errors.As(err, &uerr) {
				return "", uerr.err
			}
			log.Warn("model request failed", "error", err)
			return "", fmt.Errorf("model request failed: %w", err)
		}
		if res.truncated {
			log.Warn("model stream ended without a finish reason")
			msg := "\n\n[The model's response was cut off: its stream ended before it finished"
			if len(res.calls) > 0 {
				msg += ", and the tool calls it had started were not run"
			}
			msg += ". Send another prompt to continue.]"
			if err := r.update(acp.AgentText(msg)); err != nil {
				return "", err
			}
			return acp.StopEndTurn, nil
		}
		switch {
		case res.finish == "length":
			return acp.StopMaxTokens, nil
		case res.finish == "content_filter" || res.refusal:
			return acp.StopRefusal, nil
		case len(res.calls) == 0:
			return acp.StopEndTurn, nil
		}
		results, err := r.runTools(ctx, res)
		if err != nil {
			return "", err
		}
		r.messages = append(r.messages, results...)
	}
}

// updateError marks a failed Turn.Update (the client is gone), which ends
// the turn as is.
type updateError struct{ err error }

func (e *updateError) Error() string { return e.err.Error() }

// streamResult is one model response.
type streamResult struct {
	text      strings.Builder
	calls     []*modelCall
	finish    string
	refusal   bool
	truncated bool
}

// modelCall is one tool call as the model streamed it.
type modelCall struct {
	id, name string
	args     strings.Builder
}

// stream sends the conversation and relays the streamed answer.
func (r *openaiRun) stream(ctx context.Context) (*streamResult, error) {
	o := r.a.opts
	params := openai.ChatCompletionNewParams{
		Model:         o.Model,
		Messages:      r.messages,
		Tools:         r.tools.params,
		StreamOptions: openai.ChatCompletionStreamOptionsParam{IncludeUsage: openai.Bool(true)},
	}
	if o.MaxTokens > 0 {
		params.MaxTokens = openai.Int(o.MaxTokens)
	}
	s := r.a.client.Chat.Completions.NewStreaming(ctx, params)
	defer s.Close()

	res := &streamResult{}
	byIndex := map[int64]*modelCall{}
	var usage *openai.CompletionUsage
	for s.Next() {
		chunk := s.Current()
		if chunk.JSON.Usage.Valid() && chunk.Usage.TotalTokens > 0 {
			u := chunk.Usage
			usage = &u
		}
		for _, c := range chunk.Choices {
			if c.Index != 0 {
				continue
			}
			d := c.Delta
			if thought := reasoningDelta(d); thought != "" {
				if err := r.update(acp.ContentChunk{SessionUpdate: acp.UpdateAgentThoughtChunk, Content: acp.TextBlock(thought)}); err != nil {
					return nil, &updateError{err}
				}
			}
			if d.Content != "" {
				res.text.WriteString(d.Content)
				if err := r.update(acp.AgentText(d.Content)); err != nil {
					return nil, &updateError{err}
				}
			}
			if d.Refusal != "" {
				res.refusal = true
				if err := r.update(acp.AgentText(d.Refusal)); err != nil {
					return nil, &updateError{err}
				}
			}
			for _, tc := range d.ToolCalls {
				mc := byIndex[tc.Index]
				if mc == nil {
					mc = &modelCall{}
					byIndex[tc.Index] = mc
					res.calls = append(res.calls, mc)
				}
				if tc.ID != "" {
					mc.id = tc.ID
				}
				mc.name += tc.Function.Name
				mc.args.WriteString(tc.Function.Arguments)
			}
			if c.FinishReason != "" {
				res.finish = c.FinishReason
			}
		}
	}
	if err := s.Err(); err != nil {
		return res, err
	}
	res.truncated = res.finish == ""
	if usage != nil {
		u := acp.UsageUpdate{
			SessionUpdate: acp.UpdateUsage,
			Used:          uint64(max(usage.PromptTokens+usage.CompletionTokens, 0)),
			Size:          o.ContextWindow,
		}
		if err := r.update(u); err != nil {
			return nil, &updateError{err}
		}
	}
	return res, nil
}

// reasoningDelta is the reasoning text of a delta, in the non-standard
// fields servers stream it in: reasoning_content (DeepSeek, vLLM,
// llama.cpp) or reasoning (Ollama, OpenRouter).
func reasoningDelta(d openai.ChatCompletionChunkChoiceDelta) string {
	for _, key := range []string{"reasoning_content", "reasoning"} {
		// The SDK keeps unknown fields raw (and never Valid).
		f, ok := d.JSON.ExtraFields[key]
		if !ok {
			continue
		}
		var s string
		if json.Unmarshal([]byte(f.Raw()), &s) == nil && s != "" {
			return s
		}
	}
	return ""
}

// Close releases the idle connections of the agent's HTTP client. Call it
// once no turn runs any more.
func (a *OpenAI) Close() error {
	a.opts.HTTPClient.CloseIdleConnections()
	return nil
}

var _ io.Closer = (*OpenAI)(nil)
