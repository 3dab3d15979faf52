package sessionmgr

import (
	"context"
	"encoding/json"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/agent"
	"github.com/acpserver/acpserver/mcpctx"
)

// toolset adapts a session's MCP context to the agent's Toolset, so
// neither package imports the other.
type toolset struct{ s *mcpctx.Session }

func (t toolset) Tools() []agent.Tool {
	if t.s == nil {
		return nil
	}
	in := t.s.Tools()
	out := make([]agent.Tool, 0, len(in))
	for _, tl := range in {
		out = append(out, agent.Tool{Name: tl.Name, Description: tl.Description, InputSchema: tl.InputSchema})
	}
	return out
}

func (t toolset) CallTool(ctx context.Context, name string, args json.RawMessage) (agent.ToolResult, error) {
	if t.s == nil {
		return agent.ToolResult{}, acp.Errorf(acp.CodeNotFound, "no tools in this session")
	}
	res, err := t.s.Call(ctx, name, args)
	if err != nil {
		return agent.ToolResult{}, err
	}
	out := agent.ToolResult{IsError: res.IsError}
	for _, raw := range res.Content {
		var b acp.ContentBlock
		if json.Unmarshal(raw, &b) == nil && b.Type != "" {
			out.Content = append(out.Content, b)
		}
	}
	return out, nil
}
