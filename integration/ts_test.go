package integration

import (
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// TestTypeScriptSDK runs integration/ts (node --test) against a real server
// and a real MCP upstream: the official TypeScript ACP SDK is the client.
// It installs the pinned packages with npm ci when node_modules is absent.
// Skipped only when node or npm is not installed.
func TestTypeScriptSDK(t *testing.T) {
	node, err := exec.LookPath("node")
	if err != nil {
		t.Skip("node is not installed: the TypeScript SDK interop tests need Node 20+ and npm")
	}
	npm, err := exec.LookPath("npm")
	if err != nil {
		t.Skip("npm is not installed: the TypeScript SDK interop tests need Node 20+ and npm")
	}
	dir, err := filepath.Abs("ts")
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
	defer cancel()
	if _, err := os.Stat(filepath.Join(dir, "node_modules", ".package-lock.json")); err != nil {
		ci := exec.CommandContext(ctx, npm, "ci", "--no-audit", "--no-fund")
		ci.Dir = dir
		if out, err := ci.CombinedOutput(); err != nil {
			t.Fatalf("npm ci in %s: %v\n%s", dir, err, out)
		}
	}

	s := startServer(t)
	up := startUpstream(t, "A")
	cmd := exec.CommandContext(ctx, node, "--test", "--test-concurrency=1", "test/sdk.test.mjs")
	cmd.Dir = dir
	cmd.Env = append(os.Environ(),
		"ACPSERVER_URL="+s.url(),
		"ACPSERVER_HTTP=http://"+s.addr,
		"MCP_UPSTREAM_URL="+up.url(),
	)
	out, err := cmd.CombinedOutput()
	if err != nil {
		t.Fatalf("node --test failed: %v\n%s\nserver logs:\n%s", err, out, s.logs.String())
	}
	if strings.Contains(string(out), "# skipped 1") || !strings.Contains(string(out), "# fail 0") {
		t.Fatalf("node --test skipped or failed a test:\n%s", out)
	}
	t.Logf("node --test:\n%s", out)
	s.waitIdle(t, 10*time.Second)
	up.waitBalanced(t, 10*time.Second)
}
