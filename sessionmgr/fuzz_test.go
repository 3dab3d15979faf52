package sessionmgr

import (
	"bytes"
	"context"
	"encoding/json"
	"testing"
	"time"

	"github.com/acpserver/acpserver/acp"
)

var fuzzMethods = []string{
	acp.MethodInitialize, acp.MethodSessionNew, acp.MethodSessionLoad, acp.MethodSessionResume,
	acp.MethodSessionPrompt, acp.MethodSessionCancel, acp.MethodSessionClose, acp.MethodSessionList,
	acp.MethodSessionDelete, acp.MethodAuthenticate, "session/unknown", "_ext/notify",
}

// FuzzHandle dispatches arbitrary params to every method on a live
// connection with one real session ("SID" in params becomes its id). No
// input may panic, hang or leave a runtime or prompt behind once the
// connection ends.
func FuzzHandle(f *testing.F) {
	for i, p := range []string{
		`{"protocolVersion":1}`,
		`{"cwd":"/w","mcpServers":[]}`,
		`{"sessionId":"SID","cwd":"/w","mcpServers":[]}`,
		`{"sessionId":"SID","cwd":"/w","mcpServers":[{"name":"x","command":"","args":[],"env":[]}]}`,
		`{"sessionId":"SID","prompt":[{"type":"text","text":"hi"}]}`,
		`{"sessionId":"SID","prompt":[{"type":"text","text":"/call a/b {\"x\":1}"}]}`,
		`{"sessionId":"SID"}`,
		`{"cwd":"/w","cursor":"c2VxOjE"}`,
		`{"sessionId":"SID"}`,
		`{}`, `null`, `[]`,
	} {
		f.Add(uint8(i), []byte(p))
	}
	f.Fuzz(func(t *testing.T, mi uint8, params []byte) {
		m := New(Options{EndTimeout: time.Second})
		c, err := m.Connect("fuzz", &recPeer{})
		if err != nil {
			t.Fatal(err)
		}
		id := mustNew(t, c)
		params = bytes.ReplaceAll(params, []byte("SID"), []byte(id))
		if !json.Valid(params) {
			params = nil
		}
		method := fuzzMethods[int(mi)%len(fuzzMethods)]
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		_, _ = c.Handle(ctx, &acp.Request{ID: json.RawMessage("1"), Method: method, Params: params})
		cancel()
		c.Disconnect()
		if err := m.Shutdown(context.Background()); err != nil {
			t.Fatal(err)
		}
		m.Wait()
		if s := m.Snapshot(); s.Sessions != 0 || s.InflightPrompts != 0 || s.Connections != 0 {
			t.Fatalf("%s %s left %+v", method, params, s)
		}
	})
}
