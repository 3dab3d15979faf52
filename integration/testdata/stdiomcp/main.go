// Command stdiomcp is the stdio MCP server the integration tests start
// through acpserver. It starts a grandchild (sleep 3600) so that the tests
// can check that ending a session ends the whole process tree.
//
// Environment:
//
//	STDIOMCP_FAIL=msg      write msg to stderr and exit 1 before serving
//	STDIOMCP_IGNORE_TERM=1 ignore SIGTERM (so only SIGKILL ends it)
//	STDIOMCP_LABEL=x       returned by the whoami tool
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	"github.com/mark3labs/mcp-go/server"
)

func main() {
	if msg := os.Getenv("STDIOMCP_FAIL"); msg != "" {
		fmt.Fprintln(os.Stderr, "stdiomcp: failing on purpose:", msg)
		os.Exit(1)
	}
	if os.Getenv("STDIOMCP_IGNORE_TERM") == "1" {
		signal.Ignore(syscall.SIGTERM)
	}
	child := exec.Command("sleep", "3600")
	if err := child.Start(); err != nil {
		fmt.Fprintln(os.Stderr, "start grandchild:", err)
		os.Exit(1)
	}

	s := server.NewMCPServer("stdiomcp", "1.0.0", server.WithToolCapabilities(true))
	s.AddTool(mcp.NewTool("echo", mcp.WithDescription("echoes text"), mcp.WithString("text")),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(req.GetString("text", "")), nil
		})
	s.AddTool(mcp.NewTool("whoami", mcp.WithDescription("says which server this is")),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText("stdio:" + os.Getenv("STDIOMCP_LABEL")), nil
		})
	s.AddTool(mcp.NewTool("pids", mcp.WithDescription("this server's pid and its child's")),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			b, _ := json.Marshal(map[string]int{"pid": os.Getpid(), "child": child.Process.Pid})
			return mcp.NewToolResultText(string(b)), nil
		})
	s.AddTool(mcp.NewTool("sleep", mcp.WithDescription("sleeps ms milliseconds or until cancelled"), mcp.WithNumber("ms")),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			t := time.NewTimer(time.Duration(req.GetFloat("ms", 60000)) * time.Millisecond)
			defer t.Stop()
			select {
			case <-ctx.Done():
				return nil, ctx.Err()
			case <-t.C:
				return mcp.NewToolResultText("slept"), nil
			}
		})
	err := server.ServeStdio(s)
	if os.Getenv("STDIOMCP_IGNORE_TERM") == "1" {
		time.Sleep(time.Hour) // stdin closed or SIGTERM: linger until SIGKILL
	}
	// The grandchild is left running on purpose, like a careless server:
	// acpserver must end it through the process group.
	if err != nil {
		os.Exit(1)
	}
}
