module github.com/acpserver/acpserver

go 1.26.0

require (
	github.com/coder/websocket v1.8.15
	github.com/google/uuid v1.6.0
	github.com/lmittmann/tint v1.2.1
	go.uber.org/goleak v1.3.0
)
