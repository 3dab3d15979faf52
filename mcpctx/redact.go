package mcpctx

import (
	"errors"
	"net/url"
	"sort"
	"strings"
)

// redactor scrubs a server's secrets (header and env values, URL
// credentials and query) out of error text before it reaches a log line or
// the client. net/http errors quote the full URL, and upstream error bodies
// may echo headers back.
type redactor struct {
	secrets []string // longest first
	url     string
	safeURL string
}

func newRedactor(cfg ServerConfig) *redactor {
	r := &redactor{}
	add := func(s string) {
		if len(s) >= 4 {
			r.secrets = append(r.secrets, s)
		}
	}
	for _, v := range cfg.Headers {
		add(v)
		// "Bearer TOKEN": the token alone may appear too.
		if _, tok, ok := strings.Cut(v, " "); ok {
			add(tok)
		}
	}
	for _, v := range cfg.Env {
		add(v)
	}
	if cfg.URL != "" {
		r.url = cfg.URL
		r.safeURL = safeURL(cfg.URL)
		if u, err := url.Parse(cfg.URL); err == nil {
			if p, ok := u.User.Password(); ok {
				add(p)
			}
			for _, vs := range u.Query() {
				for _, v := range vs {
					add(v)
				}
			}
		}
	}
	sort.Slice(r.secrets, func(i, j int) bool { return len(r.secrets[i]) > len(r.secrets[j]) })
	return r
}

// safeURL is u without user info, query or fragment.
func safeURL(raw string) string {
	u, err := url.Parse(raw)
	if err != nil {
		return "(unparsable URL)"
	}
	u.User = nil
	u.RawQuery = ""
	u.Fragment = ""
	return u.String()
}

func (r *redactor) string(s string) string {
	if r.url != "" {
		s = strings.ReplaceAll(s, r.url, r.safeURL)
	}
	for _, sec := range r.secrets {
		s = strings.ReplaceAll(s, sec, "[redacted]")
	}
	return s
}

// err returns err with its text scrubbed; nil stays nil. errors.Is still
// sees the original chain.
func (r *redactor) err(err error) error {
	if err == nil {
		return nil
	}
	var re *redactedError
	if errors.As(err, &re) {
		return err
	}
	return &redactedError{msg: r.string(err.Error()), err: err}
}

type redactedError struct {
	msg string
	err error
}

func (e *redactedError) Error() string { return e.msg }
func (e *redactedError) Unwrap() error { return e.err }
