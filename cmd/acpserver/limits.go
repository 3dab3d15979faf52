package main

import (
	"bytes"
	"flag"
	"fmt"
	"log/slog"
	"net"
	"os"
	"time"
)

// limitFlags are the settings that keep one server healthy for months:
// idle eviction, limits and who may connect.
type limitFlags struct {
	idleTTL            time.Duration
	maxConnections     int
	maxSessions        int
	maxSessionsPerConn int
	authTokenFile      string
	authToken          []byte // read from authTokenFile; never logged
}

func registerLimitFlags(fs *flag.FlagSet, f *limitFlags) {
	fs.DurationVar(&f.idleTTL, "session-idle-ttl", 30*time.Minute, "end a session runtime unused this long (its record stays; the next prompt rebuilds it); 0 disables")
	fs.IntVar(&f.maxConnections, "max-connections", 1000, "open WebSocket connections in total; past it upgrades get 503 with Retry-After (0: no limit)")
	fs.IntVar(&f.maxSessions, "max-sessions", 10000, "live session runtimes in total; past it session/new, load and resume fail with -32010 (0: no limit)")
	fs.IntVar(&f.maxSessionsPerConn, "max-sessions-per-connection", 100, "live session runtimes per connection; past it session/new, load and resume fail with -32010 (0: no limit)")
	fs.StringVar(&f.authTokenFile, "auth-token-file", "", "file holding the bearer token clients must send on the upgrade (Authorization: Bearer TOKEN); empty: no token")
}

// load validates the values and reads the token file.
func (f *limitFlags) load() error {
	if f.idleTTL < 0 {
		return fmt.Errorf("--session-idle-ttl (%s) must not be negative, got %s", envName("session-idle-ttl"), f.idleTTL)
	}
	for name, n := range map[string]int{
		"max-connections": f.maxConnections, "max-sessions": f.maxSessions, "max-sessions-per-connection": f.maxSessionsPerConn,
	} {
		if n < 0 {
			return fmt.Errorf("--%s (%s) must not be negative, got %d", name, envName(name), n)
		}
	}
	if f.authTokenFile != "" {
		b, err := os.ReadFile(f.authTokenFile)
		if err != nil {
			return fmt.Errorf("--auth-token-file (%s): %w", envName("auth-token-file"), err)
		}
		f.authToken = bytes.TrimSpace(b)
		if len(f.authToken) == 0 {
			return fmt.Errorf("--auth-token-file (%s): %s is empty", envName("auth-token-file"), f.authTokenFile)
		}
	}
	return nil
}

// warnIfExposed says loudly when the server listens beyond loopback with
// no token: anyone who can reach the port can run sessions.
func (f *limitFlags) warnIfExposed(log *slog.Logger, addr net.Addr) {
	tcp, ok := addr.(*net.TCPAddr)
	if !ok || len(f.authToken) > 0 || tcp.IP.IsLoopback() {
		return
	}
	log.Warn("LISTENING BEYOND LOOPBACK WITHOUT AN AUTH TOKEN: anyone who can reach this address can run agent sessions; set --auth-token-file", "addr", addr.String())
}
