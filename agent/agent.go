// Package agent runs one prompt turn against a session's toolset and
// streams what happens as ACP session updates.
package agent

import (
	"context"
	"encoding/json"
	"sync"

	"github.com/acpserver/acpserver/acp"
)

// Tool is one tool the session can call, named SERVER/TOOL so servers never
// collide.
type Tool struct {
	Name        string
	Description string
	InputSchema json.RawMessage
}

// ToolResult is a finished tool call.
type ToolResult struct {
	Content []acp.ContentBlock
	IsError bool
}

// Toolset is the session's tools. CallTool honours ctx: cancelling it
// abandons the call upstream.
type Toolset interface {
	Tools() []Tool
	CallTool(ctx context.Context, name string, args json.RawMessage) (ToolResult, error)
}

// Turn is everything an agent needs for one session/prompt.
type Turn struct {
	SessionID string
	Prompt    []acp.ContentBlock
	// History is the session's earlier updates, oldest first, as the client
	// saw them (user_message_chunk, agent_message_chunk, tool_call, ...).
	History []json.RawMessage
	Tools   Toolset
	// Update sends one session/update to the client and records it in the
	// history. It keeps working after ctx is cancelled so a cancelled turn
	// can still report how its tool calls ended.
	Update func(update any) error
	// RequestPermission asks the client about a tool call.
	RequestPermission func(ctx context.Context, req acp.RequestPermissionRequest) (acp.RequestPermissionResponse, error)
	// State is the session runtime's memory for the agent (tools the user
	// allowed "always"). The runtime creates one when it starts and drops
	// it when it ends, so nothing outlives the runtime. Nil means nothing
	// is remembered beyond the turn.
	State *SessionState
}

// SessionState is agent memory scoped to one session runtime. Safe for
// concurrent use; the zero value is ready.
type SessionState struct {
	mu      sync.Mutex
	allowed map[string]bool
}

// Allow remembers that tool may run without asking for the rest of the
// runtime.
func (s *SessionState) Allow(tool string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.allowed == nil {
		s.allowed = make(map[string]bool)
	}
	s.allowed[tool] = true
}

// Allowed reports whether Allow(tool) was called.
func (s *SessionState) Allowed(tool string) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.allowed[tool]
}

// Agent runs turns. Prompt returns StopCancelled once ctx is cancelled and
// every update of the turn has been sent.
type Agent interface {
	Prompt(ctx context.Context, t *Turn) (acp.StopReason, error)
}
