package integration

import (
	"fmt"
	"sync"
	"testing"
	"time"
)

// 100 sessions, each with one HTTP and one stdio server, created and
// ended in every way: every count, upstream session, child process and
// file descriptor of the server back to baseline.
func TestMCPChurn100Sessions(t *testing.T) {
	up := startUpstream(t, "A")
	s := startServer(t)
	pid := s.cmd.Process.Pid

	// Warm up once so lazily opened descriptors (e.g. the stdio binary's
	// build, runtime pollers) are in the baseline.
	warm := dial(t, s)
	warm.initialize()
	warm.newSession("/tmp", httpServerEntry("up", up.url()), stdioServer(t, "local", randHex()))
	warm.close()
	s.waitIdle(t, 10*time.Second)
	up.waitBalanced(t, 5*time.Second)
	baseFDs := fdCount(pid)

	const sessions, workers = 100, 4
	marker := randHex()
	start := time.Now()
	var wg sync.WaitGroup
	errs := make(chan error, sessions)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < sessions; i += workers {
				if err := churnOne(t, s, up, marker, i); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	s.waitIdle(t, 20*time.Second)
	c := up.waitBalanced(t, 10*time.Second)
	waitNoProcs(t, marker, 10*time.Second)
	if z := zombieChildren(pid); len(z) > 0 {
		t.Fatalf("zombie children of acpserver: %v", z)
	}
	// Idle keep-alive sockets to the upstream are closed with each
	// session's HTTP transport; poll briefly for the last closes.
	deadline := time.Now().Add(5 * time.Second)
	fds := fdCount(pid)
	for fds > baseFDs && time.Now().Before(deadline) {
		time.Sleep(50 * time.Millisecond)
		fds = fdCount(pid)
	}
	t.Logf("%d sessions in %s; upstream %+v; acpserver fds before %d after %d", sessions, time.Since(start).Round(time.Millisecond), c, baseFDs, fds)
	if fds > baseFDs {
		t.Fatalf("acpserver holds %d file descriptors after churn, %d before", fds, baseFDs)
	}
	if c.inits != sessions+1 {
		t.Fatalf("upstream saw %d initializes, want %d", c.inits, sessions+1)
	}
}

// churnOne runs one session: create with both servers, one call each, and
// end it one of four ways.
func churnOne(t *testing.T, s *server, up *upstream, marker string, i int) (err error) {
	c, err := dialErr(s.url(), nil)
	if err != nil {
		return err
	}
	c.t = t
	defer c.close()
	c.initialize()
	sid := c.newSession("/tmp", httpServerEntry("up", up.url()), stdioServer(t, "local", marker))
	if st, text := c.callTool(sid, "up/whoami", "{}"); st != "completed" {
		return fmt.Errorf("session %d: http call %s %q", i, st, text)
	}
	if st, text := c.callTool(sid, "local/echo", `{"text":"hi"}`); st != "completed" || text != "hi" {
		return fmt.Errorf("session %d: stdio call %s %q", i, st, text)
	}
	switch i % 4 {
	case 0:
		c.mustCall("session/close", map[string]any{"sessionId": sid}, nil)
	case 1:
		c.kill()
	case 2:
		c.mustCall("session/delete", map[string]any{"sessionId": sid}, nil)
	case 3:
		c.close()
	}
	return nil
}
