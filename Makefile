# Toron — see README.md. `make help` lists the targets.
GO        ?= go
BIN       := bin/toron
VERSION   ?= $(shell git describe --tags --always --dirty 2>/dev/null || echo dev)
LDFLAGS   := -s -w -X main.version=$(VERSION)
FUZZTIME  ?= 30s
PKGS      := ./...

.PHONY: help build run test vet deps lint fuzz bench bench-ab bench-go bench-compare bench-slowloris bench-upload bench-slow-target bench-tunnel bench-tls bench-idle bench-global-rl bench-auth-flood loadtest clean

help: #? list the targets
	@grep -E '^[a-z-]+:.*#\?' $(MAKEFILE_LIST) | sed -E 's/:.*#\?/\t/' | sort

build: #? build bin/toron (static)
	CGO_ENABLED=0 $(GO) build -trimpath -ldflags '$(LDFLAGS)' -o $(BIN) .

run: build #? start the gateway in demo mode on 127.0.0.1:8080 with built-in upstreams (TLS=1: over HTTPS, self-signed)
	./$(BIN) -demo $(if $(TLS),-demo-tls)

test: vet deps #? vet, import-direction check, all tests with -race (fuzz seeds included), then the deploy/ manifest check (installs redis-server for the global rate-limit tests)
	@bash scripts/need-redis.sh
	$(GO) test -race -shuffle=on -timeout 20m $(PKGS)
	cd deploy && $(GO) test -race ./...

vet: #? go vet (the gateway and the nested deploy/ module)
	$(GO) vet $(PKGS)
	cd deploy && $(GO) vet ./...

lint: vet #? gofmt and go vet
	@out=$$(gofmt -l $$(git ls-files '*.go')); if [ -n "$$out" ]; then echo "gofmt needed:"; echo "$$out"; exit 1; fi

deps: #? fail when a leaf package imports conf, gateway, zap or another leaf
	@bash scripts/check-deps.sh

fuzz: #? run each fuzz target for FUZZTIME
	@bash scripts/fuzz.sh $(FUZZTIME)

bench: bench-go bench-compare bench-slowloris bench-upload bench-slow-target bench-tunnel bench-tls bench-idle bench-global-rl bench-auth-flood #? Go benchmarks (-benchmem), the peer comparison, the slowloris run, the upload ratios, the slow-target run, the tunnel run and TLS against nginx

bench-ab: build #? paired A/B of two Toron builds with nginx in the same rounds: make bench-ab OLD=/path/to/old-toron
	bash scripts/ab.sh $(OLD) $(BIN)

bench-go: #? Go benchmarks only
	$(GO) test -run='^$$' -bench=. -benchmem $(PKGS)

bench-compare: build #? direct vs Toron vs nginx vs HAProxy (installs wrk, nginx, haproxy)
	bash scripts/compare.sh

bench-slowloris: build #? /health and /api success under a 1000-connection slowloris (installs slowhttptest)
	bash scripts/slowloris.sh

bench-upload: build #? 8 concurrent 200 MB uploads, direct vs Toron vs a naive fasthttp proxy, 5 rounds (exit 3: a target missed)
	$(GO) run ./loadtest -toron $(BIN) -scenario upload -rounds 5

bench-slow-target: build #? one of 3 targets 20x slower: p2c, least_request and round_robin (share, /api p99), recovery, a target added, a killed target (exit 3: a target missed)
	$(GO) run ./loadtest -toron $(BIN) -scenario slow-target -rounds 3

bench-tunnel: build #? WebSocket tunnels: echo through a tunnel vs a TCP relay, memory per idle tunnel, /api p99 with 2,000 idle tunnels (exit 3: a target missed)
	$(GO) run ./loadtest -toron $(BIN) -scenario tunnel -rounds 5

bench-tls: build #? TLS keep-alive CPU/request and new TLS 1.3 connections/s, Toron vs nginx on one ECDSA P-256 cert (installs wrk, nginx)
	bash scripts/bench-tls.sh

bench-idle: build #? memory per idle keep-alive connection: Toron, a bare fasthttp server, nginx, HAProxy, and over TLS Toron and nginx (CONNS=10000; installs nginx, haproxy)
	bash scripts/bench-idle.sh

bench-global-rl: build #? a route limited through Redis on loopback vs per instance at 5,000 req/s: CPU/request, added p50/p99, Redis CPU per decision, decisions per round trip (installs redis-server; exit 3: a target missed)
	@bash scripts/need-redis.sh
	$(GO) run ./loadtest -toron $(BIN) -scenario global-rl -rounds 3 -duration 5s

bench-auth-flood: build #? wrong basic-auth passwords (bcrypt cost 10) flooding one route: /api p99 flood / idle on another, 5 interleaved rounds (exit 3: a target missed)
	$(GO) run ./loadtest -toron $(BIN) -scenario auth-flood -rounds 5 -duration 5s

SCENARIO ?= small-get
loadtest: build #? one load-test scenario: make loadtest SCENARIO=small-get|upload|isolation|slow-client|slow-target|tunnel|tls-silent|global-rl|auth-flood
	$(GO) run ./loadtest -toron $(BIN) -scenario $(SCENARIO)

clean: #? remove build output
	rm -rf bin out
