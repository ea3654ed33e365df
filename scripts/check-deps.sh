#!/usr/bin/env bash
# Import-direction check (STYLE 1, docs/architecture.md): main -> gateway -> upstream, listener,
# auth, limits, timeouts, streaming, socket; upstream -> timeouts, streaming, socket; main, gateway
# -> conf. The leaves (limits, timeouts, streaming, listener, auth) import only the standard
# library, fasthttp and the metrics package (and, in listener, github.com/pires/go-proxyproto; in
# auth, golang.org/x/crypto/bcrypt and github.com/golang-jwt/jwt/v5; in streaming, the
# compression libraries of its compressing writers; limits speaks to Redis with its own client);
# socket imports only the standard library.
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
for leaf in limits timeouts streaming listener auth; do
	[ -d "$leaf" ] || continue
	bad=$(go list -f '{{join .Imports "\n"}}' "./$leaf" 2>/dev/null |
		grep -E '^(toron/|go\.uber\.org/zap)' || true)
	if [ -n "$bad" ]; then
		echo "deps: $leaf must not import: $bad"
		fail=1
	fi
done
# The third-party imports of each leaf: the standard library, fasthttp and the metrics package,
# plus the one library (or family) its job needs (STYLE 1).
allowed='^(github\.com/valyala/fasthttp|github\.com/VictoriaMetrics/metrics)$'
declare -A extra=(
	[listener]='^github\.com/pires/go-proxyproto(/|$)'
	[streaming]='^github\.com/(klauspost/compress/(zstd|gzip)|molecule-man/go-brrr)$'
)
for leaf in limits timeouts streaming listener; do
	[ -d "$leaf" ] || continue
	bad=$(go list -f '{{join .Imports "\n"}}' "./$leaf" 2>/dev/null | grep '\.' | grep -vE '^toron/' |
		grep -vE "$allowed" | grep -vE "${extra[$leaf]:-^\$}" || true)
	if [ -n "$bad" ]; then
		echo "deps: $leaf must not import: $bad"
		fail=1
	fi
done
# socket: the socket calls both sides share; the standard library only (no dot in the first
# path element).
if [ -d socket ]; then
	bad=$(go list -f '{{join .Imports "\n"}}' ./socket 2>/dev/null | grep -E '^[^/]*\.|^toron/' || true)
	if [ -n "$bad" ]; then
		echo "deps: socket must import only the standard library, not: $bad"
		fail=1
	fi
fi
# upstream (STYLE 1): may import timeouts, streaming and socket, never conf, gateway, listener,
# limits or zap.
if [ -d upstream ]; then
	bad=$(go list -f '{{join .Imports "\n"}}' ./upstream 2>/dev/null |
		grep -E '^(toron/|go\.uber\.org/zap)' | grep -vE '^toron/(timeouts|streaming|socket)$' || true)
	if [ -n "$bad" ]; then
		echo "deps: upstream must not import: $bad"
		fail=1
	fi
fi
bad=$(go list -f '{{join .Imports "\n"}}' ./conf | grep -E '^toron/' || true)
if [ -n "$bad" ]; then
	echo "deps: conf must not import: $bad"
	fail=1
fi
# tracing (STYLE 1): a leaf, and the only package that imports the OpenTelemetry SDK (with
# internal/otlptest, the OTLP receiver of the tests, which only tests import).
if [ -d tracing ]; then
	bad=$(go list -f '{{join .Imports "\n"}}' ./tracing 2>/dev/null |
		grep -E '^(toron/|go\.uber\.org/zap)' || true)
	if [ -n "$bad" ]; then
		echo "deps: tracing must not import: $bad"
		fail=1
	fi
	bad=$(go list -f '{{.ImportPath}}: {{join .Imports " "}}' ./... 2>/dev/null |
		grep -vE '^toron/(tracing|internal/otlptest):' | grep -E ' go\.opentelemetry\.io/' | cut -d: -f1 || true)
	if [ -n "$bad" ]; then
		echo "deps: only tracing may import go.opentelemetry.io: $bad"
		fail=1
	fi
fi
exit $fail
