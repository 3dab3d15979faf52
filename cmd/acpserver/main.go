// Command acpserver serves ACP (Agent Client Protocol v1) agent sessions to
// IDE clients over WebSocket.
//
// Usage:
//
//	acpserver [flags]          serve on --listen (default 127.0.0.1:8765)
//	acpserver stdio [flags]    serve one ACP connection on stdin/stdout
//	acpserver bridge [flags] URL
//	                           relay an IDE's stdio to a remote server (ws:// or wss://)
//
// Every flag has an environment equivalent: --read-limit is
// ACPSERVER_READ_LIMIT. A flag given on the command line wins.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strings"
	"syscall"

	"github.com/lmittmann/tint"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	code := run(ctx, os.Args[1:], os.Stdin, os.Stdout, os.Stderr)
	stop()
	os.Exit(code)
}

// run is main without the process: it returns the exit code.
func run(ctx context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) int {
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		switch args[0] {
		case "serve":
			args = args[1:]
		case "stdio":
			return runStdio(ctx, args[1:], stdin, stdout, stderr)
		case "bridge":
			return runBridge(ctx, args[1:], stdin, stdout, stderr)
		default:
			fmt.Fprintf(stderr, "acpserver: unknown command %q (try: acpserver --help)\n", args[0])
			return 2
		}
	}
	return runWithConfig("acpserver", args, stderr, "server failed", func(cfg *serveConfig, log *slog.Logger) error {
		return serve(ctx, cfg, log)
	})
}

// runWithConfig parses the shared flags and runs body with them: exit code
// 0 on a clean end, 2 on bad flags, 1 when body fails.
func runWithConfig(name string, args []string, stderr io.Writer, failure string, body func(*serveConfig, *slog.Logger) error) int {
	cfg, err := parseServeFlags(name, args, stderr)
	if errors.Is(err, flag.ErrHelp) {
		return 0
	}
	if err != nil {
		fmt.Fprintf(stderr, "%s: %v\n", name, err)
		return 2
	}
	log := newLogger(stderr, cfg.logFormat, cfg.logLevel)
	if err := body(cfg, log); err != nil {
		log.Error(failure, "error", err)
		return 1
	}
	return 0
}

// bindEnv gives every flag of fs not set on the command line the value of
// its ACPSERVER_* environment variable, naming the setting on a bad value.
func bindEnv(fs *flag.FlagSet) error {
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	var errs []error
	fs.VisitAll(func(f *flag.Flag) {
		if set[f.Name] {
			return
		}
		env := envName(f.Name)
		if v, ok := os.LookupEnv(env); ok {
			if err := f.Value.Set(v); err != nil {
				errs = append(errs, fmt.Errorf("invalid %s=%q: %v", env, v, err))
			}
		}
	})
	return errors.Join(errs...)
}

func envName(flagName string) string {
	return "ACPSERVER_" + strings.ToUpper(strings.ReplaceAll(flagName, "-", "_"))
}

// newLogger writes colored text through tint on a terminal, plain text
// otherwise, or JSON when asked.
func newLogger(w io.Writer, format string, level slog.Level) *slog.Logger {
	if format == "json" {
		return slog.New(slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level}))
	}
	return slog.New(tint.NewHandler(w, &tint.Options{Level: level, NoColor: !isTerminal(w)}))
}

func isTerminal(w io.Writer) bool {
	f, ok := w.(*os.File)
	if !ok {
		return false
	}
	fi, err := f.Stat()
	return err == nil && fi.Mode()&os.ModeCharDevice != 0
}
