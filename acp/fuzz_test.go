package acp

import (
	"encoding/json"
	"testing"
)

// FuzzDecode feeds arbitrary frames to the message classifier: it must
// never panic, and whatever it accepts must be well formed.
func FuzzDecode(f *testing.F) {
	for _, s := range []string{
		`{"jsonrpc":"2.0","id":1,"method":"initialize","params":{"protocolVersion":1}}`,
		`{"jsonrpc":"2.0","method":"session/cancel","params":{"sessionId":"x"}}`,
		`{"jsonrpc":"2.0","id":"a","result":{}}`,
		`{"jsonrpc":"2.0","id":null,"error":{"code":-32600,"message":"x"}}`,
		`{"jsonrpc":"2.0","method":"$/cancel_request","params":{"requestId":1}}`,
		`[1,2]`, `{`, `"x"`, `{"id":{}}`, `{"jsonrpc":"2.0","id":1e400,"method":"x"}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		d := decode(data)
		n := 0
		for _, set := range []bool{d.req != nil, d.resp != nil, d.err != nil} {
			if set {
				n++
			}
		}
		if n != 1 {
			t.Fatalf("decode(%q) classified %d ways", data, n)
		}
		if d.err != nil && !validID(d.id) {
			t.Fatalf("error answer would carry invalid id %q", d.id)
		}
		if d.req != nil {
			if d.req.Method == "" {
				t.Fatal("accepted a request without a method")
			}
			var p NewSessionRequest
			_ = DecodeParams(d.req.Params, &p)
			var l ListSessionsRequest
			_ = DecodeParams(d.req.Params, &l)
		}
		if d.err != nil {
			if _, err := json.Marshal(outResponse{JSONRPC: "2.0", ID: d.id, Error: d.err}); err != nil {
				t.Fatalf("error answer does not encode: %v", err)
			}
		}
	})
}
