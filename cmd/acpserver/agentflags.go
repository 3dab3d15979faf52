package main

import (
	"flag"
	"fmt"
	"log/slog"
	"net/url"
	"os"
	"time"

	"github.com/acpserver/acpserver/agent"
)

// agentFlags select and configure the agent. With no --model the built-in
// offline agent serves every session.
type agentFlags struct {
	model           string
	baseURL         string
	apiKeyEnv       string
	timeout         time.Duration
	maxTokens       int64
	maxTurnRequests int
	retries         int
	permission      string
	allowTools      stringList
	systemPrompt    string
	contextWindow   uint64
}

func registerAgentFlags(fs *flag.FlagSet, f *agentFlags) {
	fs.StringVar(&f.model, "model", "", "model name for an OpenAI-compatible chat completions backend (empty: the built-in echo agent)")
	fs.StringVar(&f.baseURL, "model-base-url", agent.DefaultOpenAIBaseURL, "base URL of the OpenAI-compatible API (Ollama: http://127.0.0.1:11434/v1, llama.cpp: http://127.0.0.1:8080/v1)")
	fs.StringVar(&f.apiKeyEnv, "model-api-key-env", "OPENAI_API_KEY", "name of the environment variable holding the API key (the key itself is never a flag and never logged)")
	fs.DurationVar(&f.timeout, "model-timeout", agent.DefaultModelTimeout, "bound on one model request, streaming included")
	fs.Int64Var(&f.maxTokens, "model-max-tokens", 0, "max_tokens of each model response (0: the server's default)")
	fs.IntVar(&f.maxTurnRequests, "max-turn-requests", agent.DefaultMaxTurnRequests, "model requests allowed per prompt turn; past it the turn stops with max_turn_requests")
	fs.IntVar(&f.retries, "model-retries", agent.DefaultModelRetries, "retries of a model request answered 408, 409, 429 or 5xx, with exponential backoff (0: none)")
	fs.StringVar(&f.permission, "permission-policy", string(agent.PolicyAsk), "tool call permission: ask (the client approves each call) or allow-all")
	fs.Var(&f.allowTools, "allow-tools", "comma-separated SERVER/TOOL names that run without asking")
	fs.StringVar(&f.systemPrompt, "model-system-prompt", "", "system message sent first in every model request")
	fs.Uint64Var(&f.contextWindow, "model-context-window", 0, "the model's context size in tokens, reported as usage_update size (0: unknown)")
}

func (f *agentFlags) validate() error {
	if f.model == "" {
		return nil
	}
	switch agent.PermissionPolicy(f.permission) {
	case agent.PolicyAsk, agent.PolicyAllowAll:
	default:
		return fmt.Errorf("--permission-policy (%s) must be ask or allow-all, got %q", envName("permission-policy"), f.permission)
	}
	u, err := url.Parse(f.baseURL)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return fmt.Errorf("--model-base-url (%s) must be an http(s) URL, got %q", envName("model-base-url"), redactURL(f.baseURL))
	}
	if f.timeout <= 0 {
		return fmt.Errorf("--model-timeout (%s) must be positive", envName("model-timeout"))
	}
	if f.maxTokens < 0 || f.maxTurnRequests <= 0 || f.retries < 0 {
		return fmt.Errorf("--model-max-tokens and --model-retries must not be negative, --max-turn-requests must be positive")
	}
	return nil
}

// newAgent returns the configured agent, or nil (the built-in default)
// when no model is set, and a closer for it.
func (f *agentFlags) newAgent(log *slog.Logger) (agent.Agent, func(), error) {
	if f.model == "" {
		return nil, func() {}, nil
	}
	key := os.Getenv(f.apiKeyEnv)
	retries := f.retries
	if retries == 0 {
		retries = -1 // OpenAIOptions: negative means none
	}
	a, err := agent.NewOpenAI(agent.OpenAIOptions{
		Model:           f.model,
		BaseURL:         f.baseURL,
		APIKey:          key,
		Timeout:         f.timeout,
		MaxTokens:       f.maxTokens,
		MaxTurnRequests: f.maxTurnRequests,
		Retries:         retries,
		Permission:      agent.PermissionPolicy(f.permission),
		AllowTools:      f.allowTools,
		SystemPrompt:    f.systemPrompt,
		ContextWindow:   f.contextWindow,
		Logger:          log,
	})
	if err != nil {
		return nil, nil, err
	}
	log.Info("model agent enabled", "model", f.model, "base_url", redactURL(f.baseURL),
		"api_key_env", f.apiKeyEnv, "api_key_set", key != "", "permission_policy", f.permission)
	return a, func() { a.Close() }, nil
}

// redactURL drops credentials a URL may carry, for logs and errors.
func redactURL(s string) string {
	u, err := url.Parse(s)
	if err != nil {
		return "(unparsable URL)"
	}
	u.RawQuery, u.Fragment = "", ""
	return u.Redacted()
}
