package agent

import (
	"context"
	"encoding/json"
	"fmt"
	"sort"
	"strings"
	"sync/atomic"
	"time"

	"github.com/acpserver/acpserver/acp"
)

// Builtin is the offline default agent: it echoes text, lists tools with
// /tools and calls one with /call SERVER/TOOL {json}. /sleep DURATION holds
// the turn (for exercising cancellation and shutdown).
type Builtin struct {
	calls atomic.Int64
}

// Prompt runs one turn.
func (b *Builtin) Prompt(ctx context.Context, t *Turn) (acp.StopReason, error) {
	var text strings.Builder
	for _, blk := range t.Prompt {
		if blk.Type == "text" {
			text.WriteString(blk.Text)
		}
	}
	msg := strings.TrimSpace(text.String())
	switch {
	case msg == "/tools":
		return b.listTools(ctx, t)
	case strings.HasPrefix(msg, "/call "):
		return b.callTool(ctx, t, strings.TrimSpace(strings.TrimPrefix(msg, "/call ")))
	case strings.HasPrefix(msg, "/sleep "):
		d, err := time.ParseDuration(strings.TrimSpace(strings.TrimPrefix(msg, "/sleep ")))
		if err != nil {
			return acp.StopEndTurn, t.Update(acp.AgentText("usage: /sleep DURATION (e.g. /sleep 2s)"))
		}
		if err := t.Update(acp.AgentText("sleeping " + d.String())); err != nil {
			return "", err
		}
		timer := time.NewTimer(d)
		defer timer.Stop()
		select {
		case <-ctx.Done():
			return acp.StopCancelled, nil
		case <-timer.C:
		}
		return acp.StopEndTurn, t.Update(acp.AgentText("done"))
	}
	if ctx.Err() != nil {
		return acp.StopCancelled, nil
	}
	if err := t.Update(acp.AgentText(text.String())); err != nil {
		return "", err
	}
	return acp.StopEndTurn, nil
}

func (b *Builtin) listTools(ctx context.Context, t *Turn) (acp.StopReason, error) {
	var tools []Tool
	if t.Tools != nil {
		tools = t.Tools.Tools()
	}
	if len(tools) == 0 {
		return acp.StopEndTurn, t.Update(acp.AgentText("no tools available in this session"))
	}
	sort.Slice(tools, func(i, j int) bool { return tools[i].Name < tools[j].Name })
	var sb strings.Builder
	fmt.Fprintf(&sb, "%d tools:\n", len(tools))
	for _, tool := range tools {
		fmt.Fprintf(&sb, "- %s", tool.Name)
		if tool.Description != "" {
			fmt.Fprintf(&sb, ": %s", tool.Description)
		}
		sb.WriteString("\n")
	}
	if ctx.Err() != nil {
		return acp.StopCancelled, nil
	}
	return acp.StopEndTurn, t.Update(acp.AgentText(sb.String()))
}

func (b *Builtin) callTool(ctx context.Context, t *Turn, spec string) (acp.StopReason, error) {
	name, argText, _ := strings.Cut(spec, " ")
	argText = strings.TrimSpace(argText)
	if argText == "" {
		argText = "{}"
	}
	if !json.Valid([]byte(argText)) {
		return acp.StopEndTurn, t.Update(acp.AgentText("usage: /call SERVER/TOOL {json arguments}: the arguments are not valid JSON"))
	}
	id := fmt.Sprintf("call_%d", b.calls.Add(1))
	if err := t.Update(acp.ToolCall{
		SessionUpdate: acp.UpdateToolCall, ToolCallID: id, Title: name,
		Kind: acp.ToolKindOther, Status: acp.ToolPending, RawInput: json.RawMessage(argText),
	}); err != nil {
		return "", err
	}
	inProgress := acp.ToolInProgress
	if err := t.Update(acp.ToolCallUpdate{SessionUpdate: acp.UpdateToolCallUpdate, ToolCallID: id, Status: &inProgress}); err != nil {
		return "", err
	}
	var res ToolResult
	var err error
	if t.Tools == nil {
		err = fmt.Errorf("no tools available in this session")
	} else {
		res, err = t.Tools.CallTool(ctx, name, json.RawMessage(argText))
	}
	status := acp.ToolCompleted
	var content []acp.ToolCallContent
	switch {
	case err != nil:
		status = acp.ToolFailed
		msg := err.Error()
		if ctx.Err() != nil {
			msg = "cancelled"
		}
		content = append(content, acp.ToolContent(acp.TextBlock(msg)))
	default:
		if res.IsError {
			status = acp.ToolFailed
		}
		for _, c := range res.Content {
			content = append(content, acp.ToolContent(c))
		}
	}
	if uerr := t.Update(acp.ToolCallUpdate{SessionUpdate: acp.UpdateToolCallUpdate, ToolCallID: id, Status: &status, Content: content}); uerr != nil {
		return "", uerr
	}
	if ctx.Err() != nil {
		return acp.StopCancelled, nil
	}
	return acp.StopEndTurn, nil
}
