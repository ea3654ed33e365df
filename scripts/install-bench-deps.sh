#!/usr/bin/env bash
# Installs the tools of the load-test comparison (BENCHMARKS.md): wrk (load generator), nginx and
# haproxy (the peers Toron is compared with) and slowhttptest (the slowloris attack).
# Idempotent: it does nothing when every tool is already there, and runs `apt-get update` only
# when something is missing. Debian packages only.
#
# The packaged nginx and haproxy are never started as system services: the benchmark scripts run
# them in the foreground with their own temporary configuration. A policy-rc.d that refuses
# service starts is put in place for the duration of the install (when none exists), so the
# package scripts do not start a system nginx on port 80.
set -euo pipefail

# binary:package pairs: the arguments, or the benchmarks' tools (scripts/need-redis.sh passes
# redis-server's).
if [ $# -gt 0 ]; then
	tools="$*"
else
	tools="wrk:wrk nginx:nginx haproxy:haproxy slowhttptest:slowhttptest"
fi
names=$(for pair in $tools; do printf '%s ' "${pair%%:*}"; done)

missing=()
find_missing() {
	missing=()
	for pair in $tools; do
		bin=${pair%%:*}
		pkg=${pair#*:}
		if ! command -v "$bin" >/dev/null 2>&1 && [ ! -x "/usr/sbin/$bin" ]; then
			missing+=("$pkg")
		fi
	done
}

find_missing
if [ ${#missing[@]} -eq 0 ]; then
	echo "install-bench-deps: ${names% } installed"
	exit 0
fi

if [ "$(id -u)" -ne 0 ]; then
	echo "install-bench-deps: missing ${missing[*]}; run as root or: sudo apt-get install -y ${missing[*]}" >&2
	exit 1
fi

# Two test runs started at once (two worktrees, say) would race for dpkg's lock and one would
# fail: installs are serialized by a lock of our own, and what is missing is looked at again
# once it is held. apt itself waits up to 5 minutes for a lock another apt holds.
exec 9>/var/lock/toron-install-bench-deps.lock
flock -w 900 9
find_missing
if [ ${#missing[@]} -eq 0 ]; then
	echo "install-bench-deps: ${names% } installed (by another run meanwhile)"
	exit 0
fi

policy=/usr/sbin/policy-rc.d
made_policy=0
if [ ! -e "$policy" ]; then
	printf '#!/bin/sh\n# installed by toron scripts/install-bench-deps.sh for the duration of an install\nexit 101\n' >"$policy"
	chmod +x "$policy"
	made_policy=1
fi
cleanup() {
	if [ "$made_policy" = 1 ]; then rm -f "$policy"; fi
}
trap cleanup EXIT

echo "install-bench-deps: installing ${missing[*]}"
export DEBIAN_FRONTEND=noninteractive
apt-get -o DPkg::Lock::Timeout=300 update -qq
apt-get -o DPkg::Lock::Timeout=300 install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
echo "install-bench-deps: installed ${missing[*]}"
