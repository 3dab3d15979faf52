package acp

import (
	"context"
	"testing"
)

// BenchmarkCallRoundTrip measures one request/response through two peers
// over an in-memory message transport: the protocol layer's own cost.
func BenchmarkCallRoundTrip(b *testing.B) {
	a, z := newPipe()
	server, client := NewConn(a, nil), NewConn(z, nil)
	done := make(chan struct{}, 2)
	go func() { server.Serve(context.Background(), echoHandler()); done <- struct{}{} }()
	go func() { client.Serve(context.Background(), echoHandler()); done <- struct{}{} }()
	params := map[string]any{"sessionId": "0f8b2c8e-5d7c-4b8e-9d64-0a5b7c3e2f11", "prompt": []map[string]string{{"type": "text", "text": "hello"}}}
	var out map[string]any
	b.ReportAllocs()
	for b.Loop() {
		if err := client.Call(context.Background(), "echo", params, &out); err != nil {
			b.Fatal(err)
		}
	}
	b.StopTimer()
	client.Close()
	server.Close()
	<-done
	<-done
}

// BenchmarkDecode measures classifying one typical prompt request.
func BenchmarkDecode(b *testing.B) {
	msg := []byte(`{"jsonrpc":"2.0","id":42,"method":"session/prompt","params":{"sessionId":"0f8b2c8e-5d7c-4b8e-9d64-0a5b7c3e2f11","prompt":[{"type":"text","text":"please refactor the parser"}]}}`)
	b.ReportAllocs()
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if d := decode(msg); d.req == nil {
			b.Fatal("not a request")
		}
	}
}
