package main

import (
	"bytes"
	"context"
	"os"
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

func TestModelSectionOfConfigFile(t *testing.T) {
	path := t.TempDir() + "/cfg.json"
	cfgText := `{"mcpServers": {}, "model": {"name": "qwen3:8b", "baseURL": "http://127.0.0.1:11434/v1", "timeout": "2m", "maxTokens": 512, "allowTools": ["a/b", "c/d"]}}`
	if err := os.WriteFile(path, []byte(cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	t.Setenv("ACPSERVER_MODEL_MAX_TOKENS", "1024")
	cfg, err := parseServeFlags("acpserver", []string{"--config", path, "--model-timeout", "30s"}, &bytes.Buffer{})
	if err != nil {
		t.Fatal(err)
	}
	a := cfg.agent
	if a.model != "qwen3:8b" || a.baseURL != "http://127.0.0.1:11434/v1" || len(a.allowTools) != 2 {
		t.Fatalf("config values not applied: %+v", a)
	}
	if a.timeout != 30*time.Second {
		t.Fatalf("the command line must win over the config file: %v", a.timeout)
	}
	if a.maxTokens != 1024 {
		t.Fatalf("the environment must win over the config file: %v", a.maxTokens)
	}
	if err := os.WriteFile(path, []byte(`{"model": {"modle": "x"}}`), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := parseServeFlags("acpserver", []string{"--config", path}, &bytes.Buffer{}); err == nil || !strings.Contains(err.Error(), "model.modle") {
		t.Fatalf("unknown key: %v", err)
	}
}
