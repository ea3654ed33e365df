#!/usr/bin/env bash
# Isolation, Toron against nginx and HAProxy (SPEC 10, issue 32, BENCHMARKS.md "Isolation"): the
# load test's isolation scenario over the three servers in one run, their rounds interleaved.
# Each server runs in front of its own upstream (the load test's fasthttp server): Toron with the
# generated seed routes (loadtest/toron.go), nginx from a temporary prefix with
# loadtest/peers/nginx.conf (one worker, limit_conn 8 on /legacy/reports with limit_conn_status
# 503 and Retry-After: 5), HAProxy with loadtest/peers/haproxy.cfg (one thread, a 503 deny when
# the reports backend holds 8 streams). Round r measures every server, in an order turned by one
# each round, each with an idle and a flood phase back to back; the figures are the medians of
# the per-round ratios flood / idle with a 95% bootstrap interval (docs/benchmarks.md).
# It prints the load test's output, then the comparison table (also $OUT/isolation-compare.md);
# the plot is $OUT/isolation.html.
#
#   bash scripts/isolation-nginx.sh
#   PEERS=toron,nginx DURATION=3s ROUNDS=3 bash scripts/isolation-nginx.sh
#
# Exit status: 0 when Toron met its targets (the references' PASS/FAIL lines are shown, not
# enforced), 3 when Toron missed one, 1 when the run could not be set up. Every process it starts
# is stopped on exit (trap; the load test stops the servers it started). Only 127.0.0.1 is
# targeted.
set -euo pipefail
cd "$(dirname "$0")/.."

PEERS=${PEERS:-toron,nginx,haproxy} # which servers, comma-separated
DURATION=${DURATION:-5s}            # each idle and each flood phase (a Go duration)
ROUNDS=${ROUNDS:-9}
OUT=${OUT:-out/loadtest}

tmp_prefix=toron-isolation
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
need_ints ROUNDS
if ! [[ "$DURATION" =~ ^[0-9]+(ms|s|m)$ ]]; then
	echo "isolation-nginx: DURATION must be a Go duration such as 5s" >&2
	exit 2
fi
for p in ${PEERS//,/ }; do
	case "$p" in
	toron | nginx | haproxy) ;;
	*) echo "isolation-nginx: PEERS holds toron, nginx and/or haproxy, got $p" >&2; exit 2 ;;
	esac
done

bash scripts/install-bench-deps.sh

build_bins

echo "isolation-nginx: $PEERS: $ROUNDS interleaved rounds of $DURATION idle + $DURATION flood each"
echo "isolation-nginx: machine load average before: $(cut -d' ' -f1-3 /proc/loadavg)"
# In the background so that the trap can stop it (it then stops the servers it started).
"$tmp/loadtest" -scenario isolation -peers "$PEERS" -toron bin/toron -duration "$DURATION" -rounds "$ROUNDS" \
	-out "$OUT" >"$tmp/run.log" 2>&1 &
pids+=($!)
set +e
wait "$!"
rc=$?
set -e
cat "$tmp/run.log"
if [ "$rc" != 0 ] && [ "$rc" != 3 ]; then
	echo "isolation-nginx: the run failed (exit $rc)" >&2
	exit 1
fi
echo
echo "## Isolation: $PEERS, $ROUNDS interleaved rounds of $DURATION idle + $DURATION flood"
cat "$OUT/isolation-compare.md"
echo
echo "machine load average after the run: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "table: $OUT/isolation.md, $OUT/isolation-compare.md; plot: $OUT/isolation.html"
exit "$rc"
