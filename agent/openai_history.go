package agent

import (
	"encoding/json"
	"strings"

	"github.com/openai/openai-go/v3"

	"github.com/acpserver/acpserver/acp"
)

// rebuilt is the model's view of a session's earlier turns.
type rebuilt struct {
	messages  []openai.ChatCompletionMessageParamUnion
	toolCalls int // tool_call updates seen, so new ids stay unique
}

// histEntry is the part of a recorded session update the rebuild reads.
type histEntry struct {
	SessionUpdate string          `json:"sessionUpdate"`
	Content       json.RawMessage `json:"content"`
	ToolCallID    string          `json:"toolCallId"`
	Title         string          `json:"title"`
	Status        *string         `json:"status"`
	RawInput      json.RawMessage `json:"rawInput"`
}

// histCall is one recorded tool call waiting for its final update.
type histCall struct {
	id, fn, args string
	content      []acp.ToolCallContent
}

// rebuildHistory turns the recorded updates (what the client saw, in
// order) back into chat messages:
//
//   - consecutive user_message_chunk updates make one user message (blocks
//     joined with newlines, as promptText joins a live prompt);
//   - consecutive agent_message_chunk updates make the assistant's text;
//   - tool_call updates announced together (before any update of theirs)
//     join that text as the assistant message's tool_calls, each followed
//     by a tool message holding its final content, as runTools sends them;
//   - agent_thought_chunk, usage_update and unknown updates are skipped.
//
// The model's call id comes back from the toolCallId, the function name
// from the title, the arguments from rawInput.
func rebuildHistory(hist []json.RawMessage, ix *toolIndex) rebuilt {
	var (
		out       rebuilt
		user      []string
		inUser    bool
		text      strings.Builder
		calls     []*histCall
		byID      = map[string]*histCall{}
		callsDone bool // an update for the pending calls was seen
	)
	flushUser := func() {
		if inUser {
			out.messages = append(out.messages, openai.UserMessage(strings.Join(user, "\n")))
			user, inUser = nil, false
		}
	}
	flushAssistant := func() {
		if text.Len() == 0 && len(calls) == 0 {
			return
		}
		var a openai.ChatCompletionAssistantMessageParam
		if text.Len() > 0 {
			a.Content.OfString = openai.String(text.String())
		}
		for _, c := range calls {
			a.ToolCalls = append(a.ToolCalls, openai.ChatCompletionMessageToolCallUnionParam{
				OfFunction: &openai.ChatCompletionMessageFunctionToolCallParam{
					ID:       apiCallID(c.id),
					Function: openai.ChatCompletionMessageFunctionToolCallFunctionParam{Name: c.fn, Arguments: c.args},
				},
			})
		}
		out.messages = append(out.messages, openai.ChatCompletionMessageParamUnion{OfAssistant: &a})
		for _, c := range calls {
			result := resultText(c.content)
			if c.content == nil {
				result = "error: no result was recorded for this call"
			}
			out.messages = append(out.messages, openai.ToolMessage(result, apiCallID(c.id)))
		}
		text.Reset()
		calls, byID, callsDone = nil, map[string]*histCall{}, false
	}

	for _, raw := range hist {
		var e histEntry
		if json.Unmarshal(raw, &e) != nil {
			continue
		}
		switch e.SessionUpdate {
		case acp.UpdateUserMessageChunk:
			flushAssistant()
			var b acp.ContentBlock
			if json.Unmarshal(e.Content, &b) == nil {
				user = append(user, blockText(b))
				inUser = true
			}
		case acp.UpdateAgentMessageChunk:
			flushUser()
			if len(calls) > 0 {
				flushAssistant()
			}
			var b acp.ContentBlock
			if json.Unmarshal(e.Content, &b) == nil {
				text.WriteString(blockText(b))
			}
		case acp.UpdateToolCall:
			flushUser()
			out.toolCalls++
			if callsDone {
				flushAssistant()
			}
			c := &histCall{id: e.ToolCallID, fn: ix.funcFor(e.Title), args: histArgs(e.RawInput)}
			if e.Status != nil && (*e.Status == acp.ToolCompleted || *e.Status == acp.ToolFailed) {
				c.content = decodeToolContent(e.Content)
			}
			calls = append(calls, c)
			byID[c.id] = c
		case acp.UpdateToolCallUpdate:
			c := byID[e.ToolCallID]
			if c == nil {
				continue
			}
			callsDone = true
			if e.Status != nil && (*e.Status == acp.ToolCompleted || *e.Status == acp.ToolFailed) {
				c.content = decodeToolContent(e.Content)
			}
		}
	}
	flushUser()
	flushAssistant()
	return out
}

// histArgs recovers the arguments text from a recorded rawInput: a JSON
// string holds arguments that were not an object, verbatim.
func histArgs(raw json.RawMessage) string {
	if len(raw) == 0 {
		return "{}"
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s
	}
	return string(raw)
}

func decodeToolContent(raw json.RawMessage) []acp.ToolCallContent {
	var content []acp.ToolCallContent
	_ = json.Unmarshal(raw, &content)
	if content == nil {
		content = []acp.ToolCallContent{}
	}
	return content
}
