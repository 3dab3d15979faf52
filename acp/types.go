package acp

import (
	"encoding/json"
	"path/filepath"
)

// ProtocolVersion is the ACP major version this package speaks.
const ProtocolVersion = 1

// Method names (see shared/acp-schema/v1/meta.json).
const (
	MethodInitialize        = "initialize"
	MethodAuthenticate      = "authenticate"
	MethodSessionNew        = "session/new"
	MethodSessionLoad       = "session/load"
	MethodSessionResume     = "session/resume"
	MethodSessionClose      = "session/close"
	MethodSessionList       = "session/list"
	MethodSessionDelete     = "session/delete"
	MethodSessionPrompt     = "session/prompt"
	MethodSessionCancel     = "session/cancel"
	MethodSessionUpdate     = "session/update"
	MethodRequestPermission = "session/request_permission"
)

// Meta is the free-form _meta object every ACP type may carry.
type Meta = json.RawMessage

// Implementation names a client or agent.
type Implementation struct {
	Name    string  `json:"name"`
	Title   *string `json:"title,omitempty"`
	Version string  `json:"version"`
}

// InitializeRequest opens a connection.
type InitializeRequest struct {
	ProtocolVersion    *int            `json:"protocolVersion"`
	ClientCapabilities json.RawMessage `json:"clientCapabilities,omitempty"`
	ClientInfo         *Implementation `json:"clientInfo,omitempty"`
	Meta               Meta            `json:"_meta,omitempty"`
}

// InitializeResponse answers initialize.
type InitializeResponse struct {
	ProtocolVersion   int               `json:"protocolVersion"`
	AgentCapabilities AgentCapabilities `json:"agentCapabilities"`
	AgentInfo         *Implementation   `json:"agentInfo,omitempty"`
	AuthMethods       []json.RawMessage `json:"authMethods"`
}

// Empty is a capability object with no fields of its own: present means
// supported.
type Empty struct {
	Meta Meta `json:"_meta,omitempty"`
}

// AgentCapabilities is what this agent advertises.
type AgentCapabilities struct {
	LoadSession         bool                `json:"loadSession"`
	PromptCapabilities  PromptCapabilities  `json:"promptCapabilities"`
	McpCapabilities     McpCapabilities     `json:"mcpCapabilities"`
	SessionCapabilities SessionCapabilities `json:"sessionCapabilities"`
}

// PromptCapabilities lists the content kinds a prompt may carry beyond text.
type PromptCapabilities struct {
	Image           bool `json:"image"`
	Audio           bool `json:"audio"`
	EmbeddedContext bool `json:"embeddedContext"`
}

// McpCapabilities lists the MCP transports accepted in mcpServers.
type McpCapabilities struct {
	HTTP bool `json:"http"`
	SSE  bool `json:"sse"`
}

// SessionCapabilities lists the optional session methods.
type SessionCapabilities struct {
	List   *Empty `json:"list,omitempty"`
	Delete *Empty `json:"delete,omitempty"`
	Resume *Empty `json:"resume,omitempty"`
	Close  *Empty `json:"close,omitempty"`
}

// EnvVariable is one environment variable for a stdio MCP server.
type EnvVariable struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// HTTPHeader is one header for an HTTP or SSE MCP server.
type HTTPHeader struct {
	Name  string `json:"name"`
	Value string `json:"value"`
}

// MCP server transport kinds.
const (
	McpStdio = "stdio"
	McpHTTP  = "http"
	McpSSE   = "sse"
)

// McpServer is one entry of mcpServers: stdio when Type is empty, else
// "http" or "sse".
type McpServer struct {
	Type    string        `json:"type,omitempty"`
	Name    string        `json:"name"`
	Command string        `json:"command,omitempty"`
	Args    []string      `json:"args,omitempty"`
	Env     []EnvVariable `json:"env,omitempty"`
	URL     string        `json:"url,omitempty"`
	Headers []HTTPHeader  `json:"headers,omitempty"`
	Meta    Meta          `json:"_meta,omitempty"`
}

// Kind is the server's transport: McpStdio, McpHTTP or McpSSE.
func (s McpServer) Kind() string {
	if s.Type == "" {
		return McpStdio
	}
	return s.Type
}

// Validate checks the fields its kind requires.
func (s McpServer) Validate() error {
	if s.Name == "" {
		return Errorf(CodeInvalidParams, "invalid params: every mcpServers entry needs a name")
	}
	switch s.Kind() {
	case McpStdio:
		if s.Command == "" {
			return Errorf(CodeInvalidParams, "invalid params: stdio MCP server %q needs a command", s.Name)
		}
	case McpHTTP, McpSSE:
		if s.URL == "" {
			return Errorf(CodeInvalidParams, "invalid params: %s MCP server %q needs a url", s.Type, s.Name)
		}
	default:
		return Errorf(CodeInvalidParams, "invalid params: MCP server %q has unknown type %q", s.Name, s.Type)
	}
	return nil
}

// NewSessionRequest is session/new.
type NewSessionRequest struct {
	Cwd        string      `json:"cwd"`
	McpServers []McpServer `json:"mcpServers"`
	Meta       Meta        `json:"_meta,omitempty"`
}

// NewSessionResponse answers session/new.
type NewSessionResponse struct {
	SessionID string `json:"sessionId"`
}

// LoadSessionRequest is session/load; ResumeSessionRequest is the same
// shape without a history replay.
type LoadSessionRequest struct {
	SessionID  string      `json:"sessionId"`
	Cwd        string      `json:"cwd"`
	McpServers []McpServer `json:"mcpServers"`
	Meta       Meta        `json:"_meta,omitempty"`
}

// ResumeSessionRequest is session/resume.
type ResumeSessionRequest = LoadSessionRequest

// SessionIDRequest is session/close, session/delete and session/cancel.
type SessionIDRequest struct {
	SessionID string `json:"sessionId"`
	Meta      Meta   `json:"_meta,omitempty"`
}

// ListSessionsRequest is session/list.
type ListSessionsRequest struct {
	Cwd    *string `json:"cwd,omitempty"`
	Cursor *string `json:"cursor,omitempty"`
}

// SessionInfo is one entry of a session/list answer.
type SessionInfo struct {
	SessionID string  `json:"sessionId"`
	Cwd       string  `json:"cwd"`
	Title     *string `json:"title,omitempty"`
	UpdatedAt string  `json:"updatedAt,omitempty"`
}

// ListSessionsResponse answers session/list.
type ListSessionsResponse struct {
	Sessions   []SessionInfo `json:"sessions"`
	NextCursor *string       `json:"nextCursor,omitempty"`
}

// PromptRequest is session/prompt.
type PromptRequest struct {
	SessionID string         `json:"sessionId"`
	Prompt    []ContentBlock `json:"prompt"`
	Meta      Meta           `json:"_meta,omitempty"`
}

// StopReason says why a prompt turn ended.
type StopReason string

// Stop reasons.
const (
	StopEndTurn         StopReason = "end_turn"
	StopMaxTokens       StopReason = "max_tokens"
	StopMaxTurnRequests StopReason = "max_turn_requests"
	StopRefusal         StopReason = "refusal"
	StopCancelled       StopReason = "cancelled"
)

// PromptResponse answers session/prompt.
type PromptResponse struct {
	StopReason StopReason `json:"stopReason"`
}

// ContentBlock is a prompt or message content block. Fields this server
// does not model survive a decode/encode round trip unchanged.
type ContentBlock struct {
	Type string `json:"type"`
	Text string `json:"text,omitempty"`

	raw json.RawMessage
}

// TextBlock is a text content block.
func TextBlock(text string) ContentBlock { return ContentBlock{Type: "text", Text: text} }

// UnmarshalJSON keeps the raw block so unknown fields pass through.
func (b *ContentBlock) UnmarshalJSON(data []byte) error {
	var v struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	if err := json.Unmarshal(data, &v); err != nil {
		return err
	}
	b.Type, b.Text = v.Type, v.Text
	b.raw = append(json.RawMessage(nil), data...)
	return nil
}

// MarshalJSON writes the block as received, or as built.
func (b ContentBlock) MarshalJSON() ([]byte, error) {
	if b.raw != nil {
		return b.raw, nil
	}
	type plain struct {
		Type string `json:"type"`
		Text string `json:"text"`
	}
	return json.Marshal(plain{b.Type, b.Text})
}

// Session update kinds.
const (
	UpdateUserMessageChunk  = "user_message_chunk"
	UpdateAgentMessageChunk = "agent_message_chunk"
	UpdateAgentThoughtChunk = "agent_thought_chunk"
	UpdateToolCall          = "tool_call"
	UpdateToolCallUpdate    = "tool_call_update"
	UpdateUsage             = "usage_update"
)

// ContentChunk is a user_message_chunk, agent_message_chunk or
// agent_thought_chunk update.
type ContentChunk struct {
	SessionUpdate string       `json:"sessionUpdate"`
	Content       ContentBlock `json:"content"`
}

// Tool call statuses and kinds.
const (
	ToolPending    = "pending"
	ToolInProgress = "in_progress"
	ToolCompleted  = "completed"
	ToolFailed     = "failed"
	ToolKindOther  = "other"
	ToolKindFetch  = "fetch"
)

// ToolCallContent is one item of a tool call's content.
type ToolCallContent struct {
	Type    string       `json:"type"`
	Content ContentBlock `json:"content"`
}

// ToolContent wraps a content block as tool call content.
func ToolContent(b ContentBlock) ToolCallContent {
	return ToolCallContent{Type: "content", Content: b}
}

// ToolCall is the tool_call update announcing a call.
type ToolCall struct {
	SessionUpdate string            `json:"sessionUpdate"`
	ToolCallID    string            `json:"toolCallId"`
	Title         string            `json:"title"`
	Kind          string            `json:"kind,omitempty"`
	Status        string            `json:"status,omitempty"`
	Content       []ToolCallContent `json:"content,omitempty"`
	RawInput      json.RawMessage   `json:"rawInput,omitempty"`
	RawOutput     json.RawMessage   `json:"rawOutput,omitempty"`
}

// ToolCallUpdate is the tool_call_update update; nil fields are unchanged.
type ToolCallUpdate struct {
	SessionUpdate string            `json:"sessionUpdate"`
	ToolCallID    string            `json:"toolCallId"`
	Title         *string           `json:"title,omitempty"`
	Kind          *string           `json:"kind,omitempty"`
	Status        *string           `json:"status,omitempty"`
	Content       []ToolCallContent `json:"content,omitempty"`
	RawInput      json.RawMessage   `json:"rawInput,omitempty"`
	RawOutput     json.RawMessage   `json:"rawOutput,omitempty"`
}

// UsageUpdate reports context window use.
type UsageUpdate struct {
	SessionUpdate string `json:"sessionUpdate"`
	Used          uint64 `json:"used"`
	Size          uint64 `json:"size"`
}

// AgentText is an agent_message_chunk with text.
func AgentText(text string) ContentChunk {
	return ContentChunk{SessionUpdate: UpdateAgentMessageChunk, Content: TextBlock(text)}
}

// UserChunk is a user_message_chunk carrying one prompt block.
func UserChunk(b ContentBlock) ContentChunk {
	return ContentChunk{SessionUpdate: UpdateUserMessageChunk, Content: b}
}

// SessionNotification is the params of session/update. Update is one of
// the update types above, or raw JSON of one (history replay).
type SessionNotification struct {
	SessionID string `json:"sessionId"`
	Update    any    `json:"update"`
}

// PermissionOption is one choice offered by session/request_permission.
type PermissionOption struct {
	OptionID string `json:"optionId"`
	Name     string `json:"name"`
	Kind     string `json:"kind"`
}

// Permission option kinds.
const (
	PermAllowOnce    = "allow_once"
	PermAllowAlways  = "allow_always"
	PermRejectOnce   = "reject_once"
	PermRejectAlways = "reject_always"
)

// RequestPermissionRequest asks the client to approve a tool call.
type RequestPermissionRequest struct {
	SessionID string             `json:"sessionId"`
	ToolCall  ToolCallUpdate     `json:"toolCall"`
	Options   []PermissionOption `json:"options"`
}

// RequestPermissionResponse is the client's answer.
type RequestPermissionResponse struct {
	Outcome struct {
		Outcome  string `json:"outcome"` // "selected" or "cancelled"
		OptionID string `json:"optionId,omitempty"`
	} `json:"outcome"`
}

// CheckCwd validates a session's working directory: ACP requires an
// absolute path.
func CheckCwd(cwd string) error {
	if cwd == "" {
		return Errorf(CodeInvalidParams, "invalid params: cwd is required")
	}
	if !filepath.IsAbs(cwd) {
		return Errorf(CodeInvalidParams, "invalid params: cwd must be an absolute path, got %q", cwd)
	}
	return nil
}

// CheckSessionID validates that a request names a session.
func CheckSessionID(id string) error {
	if id == "" {
		return Errorf(CodeInvalidParams, "invalid params: sessionId is required")
	}
	return nil
}
