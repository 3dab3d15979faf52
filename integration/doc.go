// Package integration holds end-to-end tests: the real acpserver binary on
// a loopback port, driven over real WebSocket connections, with real MCP
// upstream servers and real child processes.
package integration
