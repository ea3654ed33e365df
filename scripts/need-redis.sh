#!/usr/bin/env bash
# Installs redis-server (and redis-cli), which the global rate-limit tests of limits/ start on
# loopback ports of their own (SPEC 17, scope: global). Idempotent: it does nothing when
# redis-server is already there, and runs `apt-get update` only when it is missing. Debian's
# package only.
#
# The packaged server is never started as a system service: the tests run their own servers in
# the foreground with a temporary directory and stop them by PID. A policy-rc.d that refuses
# service starts is put in place for the duration of the install (when none exists), so the
# package scripts do not start a system redis on port 6379.
set -euo pipefail

if command -v redis-server >/dev/null 2>&1 && command -v redis-cli >/dev/null 2>&1; then
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "need-redis: redis-server is missing; run as root or: sudo apt-get install -y redis-server" >&2
	exit 1
fi

policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\n# installed by toron scripts/need-redis.sh for the duration of an install\nexit 101\n' >"$policy"
	chmod +x "$policy"
	made_policy=1
fi
cleanup() {
	if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi
}
trap cleanup EXIT

echo "need-redis: installing redis-server"
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends redis-server redis-tools >/dev/null
echo "need-redis: installed $(redis-server --version | head -n1)"
