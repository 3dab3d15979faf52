package integration

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/mcp"
	mcpserver "github.com/mark3labs/mcp-go/server"
)

var (
	stdioMCPOnce sync.Once
	stdioMCPPath string
	stdioMCPErr  error
)

// stdioMCP builds the test stdio MCP server once, next to the acpserver
// binary (TestMain removes that directory).
func stdioMCP(t testing.TB) string {
	t.Helper()
	stdioMCPOnce.Do(func() {
		stdioMCPPath = filepath.Join(filepath.Dir(binPath), "stdiomcp")
		out, err := exec.Command("go", "build", "-o", stdioMCPPath, "./testdata/stdiomcp").CombinedOutput()
		if err != nil {
			stdioMCPErr = fmt.Errorf("build stdiomcp: %v\n%s", err, out)
		}
	})
	if stdioMCPErr != nil {
		t.Fatal(stdioMCPErr)
	}
	return stdioMCPPath
}

func randHex() string {
	b := make([]byte, 8)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// stdioServer is an ACP mcpServers entry for the test stdio server; every
// process of its tree carries marker in its environment.
func stdioServer(t testing.TB, name, marker string, env ...string) map[string]any {
	vars := []map[string]any{{"name": "STDIOMCP_MARKER", "value": marker}, {"name": "STDIOMCP_LABEL", "value": name}}
	for i := 0; i+1 < len(env); i += 2 {
		vars = append(vars, map[string]any{"name": env[i], "value": env[i+1]})
	}
	return map[string]any{"name": name, "command": stdioMCP(t), "args": []string{}, "env": vars}
}

func httpServerEntry(name, url string, headers ...string) map[string]any {
	hs := []map[string]any{}
	for i := 0; i+1 < len(headers); i += 2 {
		hs = append(hs, map[string]any{"name": headers[i], "value": headers[i+1]})
	}
	return map[string]any{"type": "http", "name": name, "url": url, "headers": hs}
}

// markedProcs lists the live (non-zombie) processes whose environment
// holds STDIOMCP_MARKER=marker, and the zombies among them.
func markedProcs(marker string) (live, zombies []int) {
	ents, _ := os.ReadDir("/proc")
	needle := []byte("STDIOMCP_MARKER=" + marker + "\x00")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		env, err := os.ReadFile(filepath.Join("/proc", e.Name(), "environ"))
		if err != nil || !bytes.Contains(env, needle) {
			continue
		}
		if procState(pid) == "Z" {
			zombies = append(zombies, pid)
		} else {
			live = append(live, pid)
		}
	}
	return live, zombies
}

// procState is the state letter of pid ("" if it is gone).
func procState(pid int) string {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return ""
	}
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 || i+2 >= len(s) {
		return ""
	}
	return s[i+2 : i+3]
}

// zombieChildren lists zombie processes whose parent is ppid.
func zombieChildren(ppid int) []int {
	var out []int
	ents, _ := os.ReadDir("/proc")
	for _, e := range ents {
		pid, err := strconv.Atoi(e.Name())
		if err != nil {
			continue
		}
		b, err := os.ReadFile(filepath.Join("/proc", e.Name(), "stat"))
		if err != nil {
			continue
		}
		s := string(b)
		i := strings.LastIndexByte(s, ')')
		f := strings.Fields(s[i+1:])
		if len(f) > 1 && f[0] == "Z" && f[1] == strconv.Itoa(ppid) {
			out = append(out, pid)
		}
	}
	return out
}

// waitNoProcs polls until no process carrying marker is left (live or
// zombie).
func waitNoProcs(t testing.TB, marker string, within time.Duration) {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		live, zombies := markedProcs(marker)
		if len(live) == 0 && len(zombies) == 0 {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("processes of the stdio server tree remain: live %v zombies %v", live, zombies)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

func fdCount(pid int) int {
	ents, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
	if err != nil {
		return -1
	}
	return len(ents)
}

// upstream is an in-process streamable HTTP MCP server (mcp-go's) whose
// session id manager counts initialize, DELETE and live sessions.
type upstream struct {
	label string
	mcp   *mcpserver.MCPServer
	http  *httptest.Server

	mu       sync.Mutex
	inits    int
	deletes  int
	live     map[string]bool
	forgot   map[string]bool // answered 404
	forget   bool            // forget every session on its next use
	hold     bool            // black hole: hold every request unanswered
	held     chan struct{}   // closed to release held requests
	calls    int
	heldReqs int
}

func startUpstream(t testing.TB, label string) *upstream {
	t.Helper()
	u := &upstream{label: label, live: map[string]bool{}, forgot: map[string]bool{}, held: make(chan struct{})}
	u.mcp = mcpserver.NewMCPServer("upstream-"+label, "1.0.0", mcpserver.WithToolCapabilities(true))
	u.mcp.AddTool(mcp.NewTool("whoami", mcp.WithDescription("says which upstream this is")),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			u.mu.Lock()
			u.calls++
			u.mu.Unlock()
			return mcp.NewToolResultText("http:" + label), nil
		})
	u.mcp.AddTool(mcp.NewTool("sleep", mcp.WithDescription("sleeps ms milliseconds or until cancelled"), mcp.WithNumber("ms")),
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
	h := mcpserver.NewStreamableHTTPServer(u.mcp, mcpserver.WithSessionIdManager(u))
	u.http = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		u.mu.Lock()
		hold := u.hold
		if hold {
			u.heldReqs++
		}
		u.mu.Unlock()
		if hold {
			select {
			case <-r.Context().Done():
			case <-u.held:
			}
			return
		}
		h.ServeHTTP(w, r)
	}))
	t.Cleanup(func() {
		u.release()
		u.http.CloseClientConnections()
		u.http.Close()
	})
	return u
}

func (u *upstream) url() string { return u.http.URL + "/mcp" }

func (u *upstream) release() {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.hold {
		u.hold = false
		close(u.held)
	}
}

func (u *upstream) blackhole() {
	u.mu.Lock()
	u.hold = true
	u.mu.Unlock()
}

// Generate, Validate and Terminate make upstream the server's
// SessionIdManager.
func (u *upstream) Generate() string {
	id := randHex()
	u.mu.Lock()
	u.inits++
	u.live[id] = true
	u.mu.Unlock()
	return id
}

func (u *upstream) Validate(id string) (bool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	if u.forget && u.live[id] {
		delete(u.live, id)
		u.forgot[id] = true
	}
	if u.live[id] {
		return false, nil
	}
	return false, errors.New("unknown session")
}

func (u *upstream) Terminate(id string) (bool, error) {
	u.mu.Lock()
	defer u.mu.Unlock()
	u.deletes++
	delete(u.live, id)
	return false, nil
}

type upCounts struct{ inits, deletes, live, forgot int }

func (u *upstream) counts() upCounts {
	u.mu.Lock()
	defer u.mu.Unlock()
	return upCounts{u.inits, u.deletes, len(u.live), len(u.forgot)}
}

// waitBalanced polls until every upstream session this upstream started
// was ended with DELETE (or forgotten by the upstream itself) and none is
// live.
func (u *upstream) waitBalanced(t testing.TB, within time.Duration) upCounts {
	t.Helper()
	deadline := time.Now().Add(within)
	for {
		c := u.counts()
		if c.live == 0 && c.deletes+c.forgot == c.inits {
			return c
		}
		if time.Now().After(deadline) {
			t.Fatalf("upstream %s: %+v; want no live session and a DELETE per initialize", u.label, c)
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// blackholeListener accepts connections and never answers.
func blackholeListener(t testing.TB) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var conns []net.Conn
	wg.Go(func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c)
			mu.Unlock()
			wg.Go(func() { _, _ = io.Copy(io.Discard, c) })
		}
	})
	t.Cleanup(func() {
		ln.Close()
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
		wg.Wait()
	})
	return "http://" + ln.Addr().String() + "/mcp"
}

// callTool runs /call and returns the tool_call_update's final status and
// text.
func (c *client) callTool(sid, name, args string) (status, text string) {
	c.t.Helper()
	_, updates := c.prompt(sid, "/call "+name+" "+args)
	return toolOutcome(updates)
}

func toolOutcome(updates []message) (status, text string) {
	for _, m := range updates {
		_, kind, u := m.update()
		if kind != "tool_call_update" {
			continue
		}
		if s, _ := u["status"].(string); s == "completed" || s == "failed" {
			status = s
			cs, _ := u["content"].([]any)
			for _, c := range cs {
				cm, _ := c.(map[string]any)
				inner, _ := cm["content"].(map[string]any)
				if s, ok := inner["text"].(string); ok {
					text += s
				}
			}
		}
	}
	return status, text
}

func addTool(u *upstream, name string) {
	u.mcp.AddTool(mcp.NewTool(name, mcp.WithDescription("added later")),
		func(ctx context.Context, req mcp.CallToolRequest) (*mcp.CallToolResult, error) {
			return mcp.NewToolResultText(name), nil
		})
}
