#!/usr/bin/env bash
# Installs redis-server (and redis-cli), which the global rate-limit tests of limits/ start on
# loopback ports of their own (SPEC 17, scope: global): Debian's packages, through the same
# idempotent installer as the benchmarks' tools (nothing when both are there; apt-get update
# only when one is missing; no system service started). The tests run their own servers in the
# foreground with a temporary directory and stop them by PID.
set -euo pipefail
cd "$(dirname "$0")/.."
if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
	exit 0
fi
exec bash scripts/install-bench-deps.sh redis-server:redis-server redis-cli:redis-tools
