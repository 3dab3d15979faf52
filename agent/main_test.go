package agent

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package's tests on any goroutine left running.
func TestMain(m *testing.M) {
	goleak.VerifyTestMain(m)
}
