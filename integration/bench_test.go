package integration

import (
	"bufio"
	"fmt"
	"os"
	"strconv"
	"strings"
	"testing"
)

// rssKiB reads a process's resident set size.
func rssKiB(b testing.TB, pid int) float64 {
	f, err := os.Open(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		b.Fatal(err)
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if rest, ok := strings.CutPrefix(sc.Text(), "VmRSS:"); ok {
			v, _ := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 64)
			return v
		}
	}
	b.Fatal("no VmRSS")
	return 0
}

// BenchmarkPromptOverWebSocket: one echo prompt turn over a real socket to
// the real server, update and response included.
func BenchmarkPromptOverWebSocket(b *testing.B) {
	s := startServer(b, "--log-level", "info")
	c := dial(b, s)
	c.initialize()
	sid := c.newSession("/tmp/bench")
	for b.Loop() {
		c.prompt(sid, "hello")
	}
}

// BenchmarkSessionChurn creates, prompts and closes sessions with an HTTP
// MCP upstream each, and reports the server's RSS and fd growth across the
// churn: both must stay flat (the public bugs grew per abandoned session).
func BenchmarkSessionChurn(b *testing.B) {
	up := startUpstream(b, "bench")
	s := startServer(b, "--log-level", "info")
	c := dial(b, s)
	c.initialize()
	churn := func(n int) {
		for range n {
			sid := c.newSession("/tmp/bench", httpServerEntry("up", up.url()))
			c.prompt(sid, "hi")
			c.mustCall("session/close", map[string]any{"sessionId": sid}, nil)
		}
	}
	churn(50)     // warm up pools and caches
	s.snapshot(b) // and the keep-alive socket /debug/sessions polls use
	pid := s.cmd.Process.Pid
	rss0, fd0 := rssKiB(b, pid), fdCount(pid)
	b.ResetTimer()
	churn(b.N)
	b.StopTimer()
	s.waitCounts(b, 0, "no live runtime", func(sn snapshot) bool { return sn.Sessions == 0 && sn.MCPClients == 0 })
	b.ReportMetric((rssKiB(b, pid)-rss0)/float64(b.N), "rss-KiB/session")
	b.ReportMetric(float64(fdCount(pid)-fd0), "fd-delta")
	up.waitBalanced(b, 0)
}

// BenchmarkIdleSessionFootprint keeps b.N sessions alive (built-in agent,
// no MCP) and reports the server's RSS per live session.
func BenchmarkIdleSessionFootprint(b *testing.B) {
	s := startServer(b, "--log-level", "info", "--max-sessions-per-connection", "0", "--max-sessions", "0")
	c := dial(b, s)
	c.initialize()
	c.prompt(c.newSession("/tmp/warm"), "warm")
	pid := s.cmd.Process.Pid
	rss0 := rssKiB(b, pid)
	b.ResetTimer()
	for range b.N {
		sid := c.newSession("/tmp/idle")
		c.prompt(sid, "a short exchange to give the session some history")
	}
	b.StopTimer()
	b.ReportMetric((rssKiB(b, pid)-rss0)/float64(b.N), "rss-KiB/session")
}
