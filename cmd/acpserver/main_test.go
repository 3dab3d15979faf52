package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	"go.uber.org/goleak"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestFlagsFromEnvironment(t *testing.T) {
	t.Setenv("ACPSERVER_SESSION_IDLE_TTL", "90s")
	t.Setenv("ACPSERVER_LISTEN", "127.0.0.1:9999")
	cfg, err := parseServeFlags("acpserver", []string{"--listen", "127.0.0.1:1234"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.limits.idleTTL != 90*time.Second {
		t.Fatalf("env not applied: %v", cfg.limits.idleTTL)
	}
	if cfg.listen != "127.0.0.1:1234" {
		t.Fatalf("the command line must win over the environment: %v", cfg.listen)
	}
}

func TestDefaults(t *testing.T) {
	cfg, err := parseServeFlags("acpserver", nil, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	if cfg.listen != "127.0.0.1:8765" || cfg.limits.idleTTL != 30*time.Minute || cfg.readLimit != 4<<20 {
		t.Fatalf("defaults changed: %+v", cfg)
	}
}

func TestBadValuesNameTheSetting(t *testing.T) {
	for _, tc := range []struct {
		args []string
		env  [2]string
		want string
	}{
		{[]string{"--session-idle-ttl", "-1s"}, [2]string{}, "session-idle-ttl"},
		{nil, [2]string{"ACPSERVER_SESSION_IDLE_TTL", "later"}, "ACPSERVER_SESSION_IDLE_TTL"},
		{[]string{"--shutdown-timeout", "0s"}, [2]string{}, "shutdown-timeout"},
		{[]string{"--log-format", "xml"}, [2]string{}, "log-format"},
	} {
		t.Run(tc.want, func(t *testing.T) {
			if tc.env[0] != "" {
				t.Setenv(tc.env[0], tc.env[1])
			}
			var out bytes.Buffer
			code := run(context.Background(), tc.args, strings.NewReader(""), &out, &out)
			if code != 2 || !strings.Contains(out.String(), tc.want) {
				t.Errorf("%v %v: exit %d, output %q", tc.args, tc.env, code, out.String())
			}
		})
	}
}
