package main

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/acpserver/acpserver/acp"
	"github.com/acpserver/acpserver/bridge"
)

type bridgeConfig struct {
	url          string
	tokenFile    string
	headers      headerList
	caFile       string
	logFormat    string
	logLevel     slog.Level
	outageWait   time.Duration
	maxBackoff   time.Duration
	pingInterval time.Duration
	maxLine      int
}

// headerList is a repeatable "Name: value" flag.
type headerList []string

func (h *headerList) String() string { return fmt.Sprint([]string(*h)) }
func (h *headerList) Set(v string) error {
	name, _, ok := strings.Cut(v, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return fmt.Errorf("header %q must look like \"Name: value\"", v)
	}
	*h = append(*h, v)
	return nil
}

func parseBridgeFlags(args []string, stderr io.Writer) (*bridgeConfig, error) {
	c := &bridgeConfig{}
	fs := flag.NewFlagSet("acpserver bridge", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintln(stderr, `usage: acpserver bridge [flags] URL

Speaks ACP over stdin/stdout to an IDE and relays it to a remote acpserver at
URL (ws:// or wss://.../acp). When the link drops it reconnects and resumes
the IDE's sessions. Logs go to stderr. Flags:`)
		fs.PrintDefaults()
	}
	fs.StringVar(&c.tokenFile, "token-file", "", "file holding a bearer token, sent as \"Authorization: Bearer TOKEN\" (re-read on every reconnect)")
	fs.Var(&c.headers, "header", "extra upgrade header \"Name: value\" (repeatable)")
	fs.StringVar(&c.caFile, "ca-file", "", "PEM file of CA certificates to trust for wss:// (default: the system roots)")
	fs.StringVar(&c.logFormat, "log-format", "text", "log format: text or json (always on stderr)")
	fs.TextVar(&c.logLevel, "log-level", slog.LevelInfo, "log level: debug, info, warn or error")
	fs.DurationVar(&c.outageWait, "outage-wait", 30*time.Second, "how long an IDE request waits for a lost link before it fails")
	fs.DurationVar(&c.maxBackoff, "max-backoff", 5*time.Second, "longest delay between reconnect attempts")
	fs.DurationVar(&c.pingInterval, "ping-interval", 15*time.Second, "keepalive ping interval to detect a dead link (0 disables)")
	fs.IntVar(&c.maxLine, "read-limit", acp.DefaultMaxLineBytes, "longest accepted stdin line (one message) in bytes")
	if err := fs.Parse(args); err != nil {
		return nil, err
	}
	if fs.NArg() > 0 {
		// Flags may also follow the URL.
		c.url = fs.Arg(0)
		if err := fs.Parse(fs.Args()[1:]); err != nil {
			return nil, err
		}
	}
	if err := bindEnv(fs); err != nil {
		return nil, err
	}
	if c.url == "" || fs.NArg() != 0 {
		fs.Usage()
		return nil, errors.New("exactly one server URL is required")
	}
	u, err := url.Parse(c.url)
	if err != nil || (u.Scheme != "ws" && u.Scheme != "wss") || u.Host == "" {
		return nil, fmt.Errorf("server URL must be ws://HOST/acp or wss://HOST/acp, got %q", c.url)
	}
	if c.logFormat != "text" && c.logFormat != "json" {
		return nil, fmt.Errorf("--log-format must be text or json, got %q", c.logFormat)
	}
	if c.outageWait <= 0 || c.maxBackoff <= 0 || c.pingInterval < 0 || c.maxLine <= 0 {
		return nil, errors.New("--outage-wait, --max-backoff and --read-limit must be positive, --ping-interval not negative")
	}
	return c, nil
}

// runBridge is the bridge subcommand: exit 0 when the IDE closes stdin (or
// on a signal), 2 on bad flags, 1 on failure.
func runBridge(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	cfg, err := parseBridgeFlags(args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "acpserver bridge: %v\n", err)
		return 2
	}
	log := newLogger(stderr, cfg.logFormat, cfg.logLevel)
	opts, err := bridgeOptions(cfg, log)
	if err != nil {
		fmt.Fprintf(stderr, "acpserver bridge: %v\n", err)
		return 2
	}
	ide := acp.NewStdioTransport(stdin, stdout, &acp.StdioOptions{MaxLineBytes: cfg.maxLine})
	if err := bridge.Run(ctx, ide, opts); err != nil {
		log.Error("bridge failed", "error", err)
		return 1
	}
	return 0
}

func bridgeOptions(cfg *bridgeConfig, log *slog.Logger) (*bridge.Options, error) {
	header := http.Header{}
	for _, h := range cfg.headers {
		name, value, _ := strings.Cut(h, ":")
		header.Add(strings.TrimSpace(name), strings.TrimSpace(value))
	}
	tr := http.DefaultTransport.(*http.Transport).Clone()
	if cfg.caFile != "" {
		pem, err := os.ReadFile(cfg.caFile)
		if err != nil {
			return nil, fmt.Errorf("--ca-file: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--ca-file %s holds no PEM certificates", cfg.caFile)
		}
		tr.TLSClientConfig = &tls.Config{RootCAs: pool, MinVersion: tls.VersionTLS12}
	}
	opts := &bridge.Options{
		URL:          cfg.url,
		Header:       header,
		HTTPClient:   &http.Client{Transport: tr},
		Logger:       log,
		OutageWait:   cfg.outageWait,
		MaxBackoff:   cfg.maxBackoff,
		PingInterval: cfg.pingInterval,
	}
	if opts.PingInterval == 0 {
		opts.PingInterval = -1
	}
	if cfg.tokenFile != "" {
		path := cfg.tokenFile
		if _, err := readToken(path); err != nil {
			return nil, err
		}
		opts.HeaderFunc = func() (http.Header, error) {
			tok, err := readToken(path)
			if err != nil {
				return nil, err
			}
			return http.Header{"Authorization": {"Bearer " + tok}}, nil
		}
	}
	return opts, nil
}

func readToken(path string) (string, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("--token-file: %w", err)
	}
	tok := strings.TrimSpace(string(b))
	if tok == "" {
		return "", fmt.Errorf("--token-file %s is empty", path)
	}
	return tok, nil
}
