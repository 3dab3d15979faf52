package agent

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"sort"
	"strings"

	"github.com/openai/openai-go/v3"
	"github.com/openai/openai-go/v3/shared"
	"golang.org/x/sync/errgroup"

	"github.com/acpserver/acpserver/acp"
)

// Texts the model (and the client) see for calls that did not run.
const (
	rejectedText  = "the user rejected this tool call"
	cancelledText = "cancelled"
	noOutputText  = "(no output)"
)

// Permission option ids offered by session/request_permission.
const (
	optAllowOnce   = "allow_once"
	optAllowAlways = "allow_always"
	optRejectOnce  = "reject_once"
)

// toolIndex maps the session's SERVER/TOOL names to function names the
// chat completions API accepts (^[a-zA-Z0-9_-]{1,64}$) and back. The
// mapping depends only on the set of tool names, so a rebuilt history
// names the same functions.
type toolIndex struct {
	set    Toolset
	byFunc map[string]Tool
	toFunc map[string]string
	params []openai.ChatCompletionToolUnionParam
}

func newToolIndex(set Toolset) *toolIndex {
	ix := &toolIndex{set: set, byFunc: map[string]Tool{}, toFunc: map[string]string{}}
	if set == nil {
		return ix
	}
	tools := set.Tools()
	sort.Slice(tools, func(i, j int) bool { return tools[i].Name < tools[j].Name })
	for _, tl := range tools {
		fn := funcName(tl.Name)
		for i := 2; ix.byFunc[fn].Name != ""; i++ {
			suffix := fmt.Sprintf("_%d", i)
			fn = funcName(tl.Name)
			fn = fn[:min(len(fn), 64-len(suffix))] + suffix
		}
		ix.byFunc[fn] = tl
		ix.toFunc[tl.Name] = fn
		def := shared.FunctionDefinitionParam{Name: fn, Parameters: schemaParams(tl.InputSchema)}
		if tl.Description != "" {
			def.Description = openai.String(tl.Description)
		}
		ix.params = append(ix.params, openai.ChatCompletionFunctionTool(def))
	}
	return ix
}

// funcName turns SERVER/TOOL into SERVER__TOOL, other characters the API
// refuses into _, and shortens long names with a hash. Valid names map to
// themselves.
func funcName(name string) string {
	var b strings.Builder
	for _, c := range name {
		switch {
		case c == '/':
			b.WriteString("__")
		case c == '_' || c == '-' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9':
			b.WriteRune(c)
		default:
			b.WriteByte('_')
		}
	}
	s := b.String()
	if s == "" {
		s = "tool"
	}
	if len(s) > 64 {
		sum := sha256.Sum256([]byte(name))
		s = s[:55] + "_" + hex.EncodeToString(sum[:4])
	}
	return s
}

// funcFor names a tool (SERVER/TOOL, or the name an unknown call used) as
// a function, for the model's view of the history.
func (ix *toolIndex) funcFor(title string) string {
	if fn, ok := ix.toFunc[title]; ok {
		return fn
	}
	if _, ok := ix.byFunc[title]; ok {
		return title // an unknown call whose name is taken now: keep it
	}
	if strings.Contains(title, "/") {
		return funcName(title)
	}
	return title
}

func schemaParams(raw json.RawMessage) shared.FunctionParameters {
	var m map[string]any
	if len(raw) == 0 || json.Unmarshal(raw, &m) != nil || m == nil {
		return shared.FunctionParameters{"type": "object", "properties": map[string]any{}}
	}
	if _, ok := m["type"]; !ok {
		m["type"] = "object"
	}
	return m
}

// callState is one tool call of a model response on its way through the
// permission check and the tool.
type callState struct {
	id     string // ACP toolCallId, unique in the session
	apiID  string // id the model uses, sent back in the tool message
	fn     string // function name the model used
	tool   Tool   // zero when the name is unknown
	args   string // canonical JSON text of the arguments
	valid  bool   // args is a JSON object
	ok     bool   // known tool with valid arguments
	reason string // why not, when !ok

	status  string
	content []acp.ToolCallContent
}

// toolCallID makes the session-unique ACP id of a model's tool call: the
// session's tool call ordinal, then the model's id. apiCallID recovers the
// model's id for the history.
func toolCallID(ordinal int, apiID string) string {
	return fmt.Sprintf("tc%d:%s", ordinal, apiID)
}

func apiCallID(id string) string {
	if strings.HasPrefix(id, "tc") {
		if _, after, ok := strings.Cut(id, ":"); ok {
			return after
		}
	}
	return id
}

// canonicalArgs is the arguments text as the session record stores it
// (compact, HTML-escaped, as encoding/json writes RawMessage), so the live
// conversation and a rebuilt one match byte for byte. ok is false when the
// text is not a JSON object.
func canonicalArgs(text string) (string, bool) {
	if strings.TrimSpace(text) == "" {
		text = "{}"
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal([]byte(text), &obj); err != nil || obj == nil {
		return text, false
	}
	b, err := json.Marshal(json.RawMessage(text))
	if err != nil {
		return text, false
	}
	return string(b), true
}

// runTools announces, authorizes and runs the tool calls of one model
// response, and returns the messages that carry it into the conversation:
// the assistant message, then one tool message per call in order.
func (r *openaiRun) runTools(ctx context.Context, res *streamResult) ([]openai.ChatCompletionMessageParamUnion, error) {
	calls := make([]*callState, 0, len(res.calls))
	for _, mc := range res.calls {
		r.ordinal++
		apiID := mc.id
		if apiID == "" {
			apiID = fmt.Sprintf("call_%d", r.ordinal)
		}
		c := &callState{id: toolCallID(r.ordinal, apiID), apiID: apiID, fn: mc.name}
		c.args, c.valid = canonicalArgs(mc.args.String())
		tool, known := r.tools.byFunc[mc.name]
		switch {
		case !known:
			c.reason = unknownToolText(mc.name, r.tools)
		case !c.valid:
			c.tool = tool
			c.reason = fmt.Sprintf("error: the arguments are not a valid JSON object: %s", truncateText(c.args, 200))
		default:
			c.tool, c.ok = tool, true
		}
		calls = append(calls, c)
	}

	// Announce every call before any of them moves on: the history then
	// shows one response's calls together (see rebuildHistory).
	for _, c := range calls {
		if err := r.update(c.announce()); err != nil {
			return nil, err
		}
	}
	assistant := openai.ChatCompletionAssistantMessageParam{}
	if text := res.text.String(); text != "" {
		assistant.Content.OfString = openai.String(text)
	}
	for _, c := range calls {
		assistant.ToolCalls = append(assistant.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
			OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
				ID:       c.apiID,
				Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.fn, Arguments: c.args},
			},
		})
	}

	// Ask one call at a time, in order, so "allow always" on the first
	// call covers the next ones of the same tool.
	var run []*callState
	for _, c := range calls {
		switch {
		case !c.ok:
			c.finish(acp.ToolFailed, c.reason)
		case ctx.Err() != nil:
			c.finish(acp.ToolFailed, cancelledText)
		default:
			allowed, why := r.authorize(ctx, c)
			if allowed {
				run = append(run, c)
			} else {
				c.finish(acp.ToolFailed, why)
			}
		}
	}
	for _, c := range calls {
		if c.status != "" {
			if err := r.update(c.final()); err != nil {
				return nil, err
			}
		}
	}

	// Run the allowed calls concurrently; all are joined before the turn
	// goes on, cancelled or not.
	var g errgroup.Group
	for _, c := range run {
		g.Go(func() error { return r.call(ctx, c) })
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}

	msgs := []openai.ChatCompletionMessageParamUnion{{OfAssistant: &assistant}}
	for _, c := range calls {
		msgs = append(msgs, openai.ToolMessage(resultText(c.content), c.apiID))
	}
	return msgs, nil
}

func unknownToolText(name string, ix *toolIndex) string {
	names := make([]string, 0, len(ix.byFunc))
	for fn := range ix.byFunc {
		names = append(names, fn)
	}
	sort.Strings(names)
	if len(names) == 0 {
		return fmt.Sprintf("error: unknown tool %q: this session has no tools", name)
	}
	return fmt.Sprintf("error: unknown tool %q; available tools: %s", name, strings.Join(names, ", "))
}

func (c *callState) title() string {
	if c.tool.Name != "" {
		return c.tool.Name
	}
	return c.fn
}

// rawInput is the arguments object, or, when the model sent something
// else, its text verbatim as a JSON string (rebuildHistory relies on this).
func (c *callState) rawInput() json.RawMessage {
	if c.valid {
		return json.RawMessage(c.args)
	}
	b, _ := json.Marshal(c.args)
	return b
}

func (c *callState) announce() acp.ToolCall {
	return acp.ToolCall{
		SessionUpdate: acp.UpdateToolCall, ToolCallID: c.id, Title: c.title(),
		Kind: acp.ToolKindOther, Status: acp.ToolPending, RawInput: c.rawInput(),
	}
}

func (c *callState) finish(status, text string) {
	c.status = status
	c.content = []acp.ToolCallContent{acp.ToolContent(acp.TextBlock(text))}
}

func (c *callState) final() acp.ToolCallUpdate {
	status := c.status
	return acp.ToolCallUpdate{SessionUpdate: acp.UpdateToolCallUpdate, ToolCallID: c.id, Status: &status, Content: c.content}
}

// authorize applies the permission policy to one call. It returns false
// with the text to report when the call must not run.
func (r *openaiRun) authorize(ctx context.Context, c *callState) (bool, string) {
	name := c.tool.Name
	switch {
	case r.a.opts.Permission == PolicyAllowAll, r.a.allow[name], r.allowed[name]:
		return true, ""
	case r.t.State != nil && r.t.State.Allowed(name):
		return true, ""
	case r.t.RequestPermission == nil:
		return false, "error: this client cannot approve tool calls"
	}
	pending := acp.ToolPending
	title, kind := c.title(), acp.ToolKindOther
	resp, err := r.t.RequestPermission(ctx, acp.RequestPermissionRequest{
		SessionID: r.t.SessionID,
		ToolCall: acp.ToolCallUpdate{
			SessionUpdate: acp.UpdateToolCallUpdate, ToolCallID: c.id,
			Title: &title, Kind: &kind, Status: &pending, RawInput: c.rawInput(),
		},
		Options: []acp.PermissionOption{
			{OptionID: optAllowOnce, Name: "Allow once", Kind: acp.PermAllowOnce},
			{OptionID: optAllowAlways, Name: "Allow always (this session)", Kind: acp.PermAllowAlways},
			{OptionID: optRejectOnce, Name: "Reject", Kind: acp.PermRejectOnce},
		},
	})
	switch {
	case ctx.Err() != nil:
		return false, cancelledText
	case err != nil:
		r.a.log.Warn("permission request failed", "session_id", r.t.SessionID, "error", err)
		return false, fmt.Sprintf("error: asking the user for permission failed: %v", err)
	case resp.Outcome.Outcome != "selected":
		return false, cancelledText
	}
	switch resp.Outcome.OptionID {
	case optAllowOnce:
		return true, ""
	case optAllowAlways:
		if r.t.State != nil {
			r.t.State.Allow(name)
		} else {
			if r.allowed == nil {
				r.allowed = map[string]bool{}
			}
			r.allowed[name] = true
		}
		return true, ""
	default:
		return false, rejectedText
	}
}

// call runs one allowed call and reports how it ended. Its error is only
// a failed update (the client is gone).
func (r *openaiRun) call(ctx context.Context, c *callState) error {
	if ctx.Err() != nil {
		c.finish(acp.ToolFailed, cancelledText)
		return r.update(c.final())
	}
	inProgress := acp.ToolInProgress
	if err := r.update(acp.ToolCallUpdate{SessionUpdate: acp.UpdateToolCallUpdate, ToolCallID: c.id, Status: &inProgress}); err != nil {
		c.finish(acp.ToolFailed, cancelledText)
		return err
	}
	res, err := r.tools.set.CallTool(ctx, c.tool.Name, json.RawMessage(c.args))
	switch {
	case ctx.Err() != nil:
		c.finish(acp.ToolFailed, cancelledText)
	case err != nil:
		c.finish(acp.ToolFailed, "error: "+err.Error())
	default:
		c.status = acp.ToolCompleted
		if res.IsError {
			c.status = acp.ToolFailed
		}
		c.content = nil
		for _, b := range res.Content {
			c.content = append(c.content, acp.ToolContent(b))
		}
	}
	return r.update(c.final())
}

// resultText is what the model reads for a finished call: the text of its
// content. The same function rebuilds it from the history.
func resultText(content []acp.ToolCallContent) string {
	var parts []string
	for _, tc := range content {
		if t := blockText(tc.Content); t != "" {
			parts = append(parts, t)
		}
	}
	if len(parts) == 0 {
		return noOutputText
	}
	return strings.Join(parts, "\n")
}

// blockText renders a content block as text for the model: text as is,
// embedded resources by their text, anything else as a short marker.
func blockText(b acp.ContentBlock) string {
	if b.Type == "text" {
		return b.Text
	}
	raw, err := json.Marshal(b)
	if err != nil {
		return "[" + b.Type + "]"
	}
	var v struct {
		URI      string `json:"uri"`
		Name     string `json:"name"`
		Resource struct {
			URI  string `json:"uri"`
			Text string `json:"text"`
		} `json:"resource"`
	}
	_ = json.Unmarshal(raw, &v)
	switch b.Type {
	case "resource":
		if v.Resource.Text != "" {
			return fmt.Sprintf("Contents of %s:\n%s", v.Resource.URI, v.Resource.Text)
		}
		return fmt.Sprintf("[resource %s]", v.Resource.URI)
	case "resource_link":
		return fmt.Sprintf("[resource link %s %s]", v.Name, v.URI)
	}
	return "[" + b.Type + " content]"
}

// promptText is a prompt's blocks as one user message.
func promptText(blocks []acp.ContentBlock) string {
	parts := make([]string, 0, len(blocks))
	for _, b := range blocks {
		parts = append(parts, blockText(b))
	}
	return strings.Join(parts, "\n")
}

func truncateText(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return strings.ToValidUTF8(s[:n], "") + "…"
}
