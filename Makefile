# acpserver: see README.md.
GO      ?= go
BIN     ?= bin/acpserver
VERSION ?= $(shell git describe --always --dirty 2>/dev/null || echo dev)
LDFLAGS := -X main.version=$(VERSION)

.PHONY: build run test lint bench fuzz clean

build:
	$(GO) build -ldflags "$(LDFLAGS)" -o $(BIN) ./cmd/acpserver

# The server with its embedded defaults (127.0.0.1:8765, built-in agent).
run:
	$(GO) run -ldflags "$(LDFLAGS)" ./cmd/acpserver $(ARGS)

test:
	$(GO) vet ./...
	$(GO) test -race -count=1 -timeout 20m ./...

lint:
	@unformatted="$$(gofmt -l $$(git ls-files '*.go'))"; \
	if [ -n "$$unformatted" ]; then echo "gofmt needed:"; echo "$$unformatted"; exit 1; fi
	$(GO) vet ./...

bench:
	$(GO) test -run '^$$' -bench . -benchmem -count 6 ./...

clean:
	rm -rf bin
