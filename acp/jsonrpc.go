// Package acp is the ACP v1 wire protocol: JSON-RPC 2.0 over a message
// transport (one JSON value per message), request/response correlation in
// both directions, ordered notifications and $/cancel_request.
//
// It knows nothing of sessions; the session manager plugs in as a Handler.
package acp

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// JSON-RPC 2.0 and ACP error codes.
const (
	CodeParseError     = -32700
	CodeInvalidRequest = -32600
	CodeMethodNotFound = -32601
	CodeInvalidParams  = -32602
	CodeInternalError  = -32603
	CodeCancelled      = -32800
	CodeAuthRequired   = -32000 // ACP: authentication required
	CodeNotFound       = -32002 // ACP: resource (session) not found

	// Implementation-defined codes, outside those ACP reserves. ACP clients
	// treat -32000 as "start authentication", so it is never used for these.

	// CodeRetryLater: a limit is reached or the server is shutting down;
	// the same request may succeed later.
	CodeRetryLater = -32010
	// CodeBusy: the session already runs a prompt.
	CodeBusy = -32011
)

// Error is a JSON-RPC error object. Two Errors match under errors.Is when
// their codes are equal, so callers can test for a kind without comparing
// messages.
type Error struct {
	Code    int             `json:"code"`
	Message string          `json:"message"`
	Data    json.RawMessage `json:"data,omitempty"`
}

func (e *Error) Error() string { return fmt.Sprintf("jsonrpc error %d: %s", e.Code, e.Message) }

// Is reports whether target is an *Error with the same code.
func (e *Error) Is(target error) bool {
	var t *Error
	return errors.As(target, &t) && t.Code == e.Code
}

// Errorf builds an *Error with a formatted message.
func Errorf(code int, format string, args ...any) *Error {
	return &Error{Code: code, Message: fmt.Sprintf(format, args...)}
}

// Sentinels for errors.Is.
var (
	ErrParse          = &Error{Code: CodeParseError, Message: "parse error"}
	ErrInvalidRequest = &Error{Code: CodeInvalidRequest, Message: "invalid request"}
	ErrMethodNotFound = &Error{Code: CodeMethodNotFound, Message: "method not found"}
	ErrInvalidParams  = &Error{Code: CodeInvalidParams, Message: "invalid params"}
	ErrInternal       = &Error{Code: CodeInternalError, Message: "internal error"}
	ErrCancelled      = &Error{Code: CodeCancelled, Message: "request cancelled"}
	ErrNotFound       = &Error{Code: CodeNotFound, Message: "resource not found"}
)

// Request is one incoming call or notification. ID is the raw JSON id (a
// string, a number or null) echoed verbatim in the response; it is nil for
// a notification.
type Request struct {
	ID     json.RawMessage
	Method string
	Params json.RawMessage
}

// IsNotification reports whether the sender expects no response.
func (r *Request) IsNotification() bool { return r.ID == nil }

// DecodeParams unmarshals params into v, turning any failure into an
// invalid-params error that names the problem. Unknown fields are ignored so
// _meta and future fields pass through.
func DecodeParams(params json.RawMessage, v any) error {
	if len(params) == 0 || bytes.Equal(bytes.TrimSpace(params), []byte("null")) {
		return Errorf(CodeInvalidParams, "invalid params: params are required")
	}
	if err := json.Unmarshal(params, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return Errorf(CodeInvalidParams, "invalid params: field %q must be %s", te.Field, te.Type.String())
		}
		return Errorf(CodeInvalidParams, "invalid params: %v", err)
	}
	return nil
}

// wireMsg is any JSON-RPC message on the wire. Pointers to RawMessage tell
// "absent" from "null".
type wireMsg struct {
	JSONRPC string           `json:"jsonrpc"`
	ID      *json.RawMessage `json:"id,omitempty"`
	Method  *string          `json:"method,omitempty"`
	Params  json.RawMessage  `json:"params,omitempty"`
	Result  json.RawMessage  `json:"result,omitempty"`
	Error   *Error           `json:"error,omitempty"`
}

type outResponse struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id"`
	Result  any             `json:"result,omitempty"`
	Error   *Error          `json:"error,omitempty"`
}

type outRequest struct {
	JSONRPC string          `json:"jsonrpc"`
	ID      json.RawMessage `json:"id,omitempty"`
	Method  string          `json:"method"`
	Params  any             `json:"params,omitempty"`
}

var nullID = json.RawMessage("null")

// validID reports whether raw is a JSON string, number or null.
func validID(raw json.RawMessage) bool {
	raw = bytes.TrimSpace(raw)
	if len(raw) == 0 {
		return false
	}
	switch raw[0] {
	case '"':
		var s string
		return json.Unmarshal(raw, &s) == nil
	case 'n':
		return string(raw) == "null"
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		var n json.Number
		return json.Unmarshal(raw, &n) == nil
	}
	return false
}

// decoded is the classification of one incoming message.
type decoded struct {
	req  *Request // a call or notification
	resp *wireMsg // a response to one of our calls
	err  *Error   // a message we must answer with an error
	id   json.RawMessage
}

// maxDepth bounds JSON nesting so a hostile message cannot exhaust the stack
// of anything that walks it later.
const maxDepth = 128

// decode classifies one message. It never panics on any input.
func decode(data []byte) decoded {
	if !json.Valid(data) {
		return decoded{err: Errorf(CodeParseError, "parse error: message is not valid JSON"), id: nullID}
	}
	if depth(data) > maxDepth {
		return decoded{err: Errorf(CodeInvalidRequest, "invalid request: JSON nested deeper than %d", maxDepth), id: nullID}
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) == 0 || trimmed[0] != '{' {
		if len(trimmed) > 0 && trimmed[0] == '[' {
			return decoded{err: Errorf(CodeInvalidRequest, "invalid request: batches are not supported"), id: nullID}
		}
		return decoded{err: Errorf(CodeInvalidRequest, "invalid request: message must be a JSON object"), id: nullID}
	}
	var m wireMsg
	if err := json.Unmarshal(data, &m); err != nil {
		return decoded{err: Errorf(CodeInvalidRequest, "invalid request: %v", err), id: nullID}
	}
	id := nullID
	if m.ID != nil {
		if !validID(*m.ID) {
			return decoded{err: Errorf(CodeInvalidRequest, "invalid request: id must be a string, number or null"), id: nullID}
		}
		id = *m.ID
	}
	if m.JSONRPC != "2.0" {
		return decoded{err: Errorf(CodeInvalidRequest, `invalid request: "jsonrpc" must be "2.0"`), id: id}
	}
	if m.Method != nil {
		if *m.Method == "" {
			return decoded{err: Errorf(CodeInvalidRequest, "invalid request: empty method"), id: id}
		}
		if m.Result != nil || m.Error != nil {
			return decoded{err: Errorf(CodeInvalidRequest, "invalid request: a request carries no result or error"), id: id}
		}
		if p := bytes.TrimSpace(m.Params); len(p) > 0 && p[0] != '{' && p[0] != '[' && string(p) != "null" {
			return decoded{err: Errorf(CodeInvalidRequest, "invalid request: params must be an object or array"), id: id}
		}
		r := &Request{Method: *m.Method, Params: m.Params}
		if m.ID != nil {
			r.ID = id
		}
		return decoded{req: r}
	}
	if m.ID != nil && (m.Result != nil || m.Error != nil) {
		return decoded{resp: &m}
	}
	return decoded{err: Errorf(CodeInvalidRequest, "invalid request: no method"), id: id}
}

// depth returns the maximum nesting depth of a valid JSON document, skipping
// string contents.
func depth(data []byte) int {
	d, maxd, inStr, esc := 0, 0, false, false
	for _, c := range data {
		if inStr {
			switch {
			case esc:
				esc = false
			case c == '\\':
				esc = true
			case c == '"':
				inStr = false
			}
			continue
		}
		switch c {
		case '"':
			inStr = true
		case '{', '[':
			d++
			if d > maxd {
				maxd = d
			}
		case '}', ']':
			d--
		}
	}
	return maxd
}
