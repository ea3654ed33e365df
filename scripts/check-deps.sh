#!/usr/bin/env bash
# Import-direction check (STYLE 1): main -> gateway -> limits, timeouts, streaming; main, gateway
# -> conf. The leaves (limits, timeouts, streaming, listener) import only the standard library,
# fasthttp and the metrics package (and, in listener, github.com/pires/go-proxyproto).
set -euo pipefail
cd "$(dirname "$0")/.."
fail=0
for leaf in limits timeouts streaming listener; do
	[ -d "$leaf" ] || continue
	bad=$(go list -f '{{join .Imports "\n"}}' "./$leaf" 2>/dev/null |
		grep -E '^(toron/|go\.uber\.org/zap)' || true)
	if [ -n "$bad" ]; then
		echo "deps: $leaf must not import: $bad"
		fail=1
	fi
done
# upstream (STYLE 1): may import timeouts and streaming, never conf, gateway, the other leaves or zap.
if [ -d upstream ]; then
	bad=$(go list -f '{{join .Imports "\n"}}' ./upstream 2>/dev/null |
		grep -E '^(toron/|go\.uber\.org/zap)' | grep -vE '^toron/(timeouts|streaming)$' || true)
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
exit $fail
