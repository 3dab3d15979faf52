package mcpctx

import (
	"context"
	"io"
	"net"
	"net/http"
	"sync"
	"time"
)

// httpClient is the per-client HTTP stack: its own Transport (so ending the
// client can close its idle keep-alive sockets, which mcp-go's Close does
// not) and a kill switch that aborts every request still in flight (so a
// black-holed upstream cannot hold a close past its bound).
type httpClient struct {
	tr     *http.Transport
	kill   context.Context
	doKill context.CancelFunc
	client *http.Client
}

func newHTTPClient() *httpClient {
	tr := &http.Transport{
		Proxy:                 http.ProxyFromEnvironment,
		DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		ForceAttemptHTTP2:     true,
		MaxIdleConnsPerHost:   4,
		IdleConnTimeout:       90 * time.Second,
		TLSHandshakeTimeout:   10 * time.Second,
		ExpectContinueTimeout: time.Second,
	}
	h := &httpClient{tr: tr}
	h.kill, h.doKill = context.WithCancel(context.Background())
	h.client = &http.Client{Transport: killableRT{base: tr, kill: h.kill}}
	return h
}

// release aborts what is still in flight and closes the idle sockets.
func (h *httpClient) release() {
	h.doKill()
	h.tr.CloseIdleConnections()
}

// killableRT ties every request to a client-wide kill context as well as
// its own.
type killableRT struct {
	base http.RoundTripper
	kill context.Context
}

func (k killableRT) RoundTrip(req *http.Request) (*http.Response, error) {
	if err := k.kill.Err(); err != nil {
		return nil, errClientClosed
	}
	ctx, cancel := context.WithCancel(req.Context())
	stop := context.AfterFunc(k.kill, cancel)
	resp, err := k.base.RoundTrip(req.WithContext(ctx))
	if err != nil {
		stop()
		cancel()
		return nil, err
	}
	resp.Body = &cancelBody{ReadCloser: resp.Body, done: func() { stop(); cancel() }}
	return resp, nil
}

type cancelBody struct {
	io.ReadCloser
	once sync.Once
	done func()
}

func (b *cancelBody) Close() error {
	err := b.ReadCloser.Close()
	b.once.Do(b.done)
	return err
}
