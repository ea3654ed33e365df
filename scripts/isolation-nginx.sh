#!/usr/bin/env bash
# Isolation, Toron against nginx (SPEC 10, BENCHMARKS.md "Isolation"): the load test's isolation
# scenario run against Toron and then against nginx, one after the other, with the same rates,
# phases and rounds. Each run starts its own upstream (the load test's fasthttp server) and its
# own server in front of it: Toron with the generated seed routes (loadtest/toron.go), nginx in the
# foreground from a temporary prefix with loadtest/peers/nginx.conf (one worker, limit_conn 8 on
# /legacy/reports with limit_conn_status 503 and Retry-After: 5, /health answered by nginx).
# It prints both summary tables, then one comparison table (also written to
# $OUT/isolation-compare.md); the plots are $OUT/isolation.html and $OUT/isolation-nginx.html.
#
#   bash scripts/isolation-nginx.sh
#   PEERS=nginx DURATION=5s ROUNDS=1 bash scripts/isolation-nginx.sh
#
# Exit status: 0 when Toron met its targets (nginx is a reference: its PASS/FAIL lines are shown,
# not enforced), 3 when Toron missed one, 1 when a run could not be set up. Every process it
# starts is stopped on exit (trap; the load test stops the server it started). Only 127.0.0.1 is
# targeted.
set -euo pipefail
cd "$(dirname "$0")/.."

PEERS=${PEERS:-toron nginx}    # which servers, in this order
DURATION=${DURATION:-10s}      # each idle and each saturated phase (a Go duration)
ROUNDS=${ROUNDS:-3}
OUT=${OUT:-out/loadtest}

case "$ROUNDS" in
'' | *[!0-9]*) echo "isolation-nginx: ROUNDS must be an integer" >&2; exit 2 ;;
esac
if ! [[ "$DURATION" =~ ^[0-9]+(ms|s|m)$ ]]; then
	echo "isolation-nginx: DURATION must be a Go duration such as 10s" >&2
	exit 2
fi
for p in $PEERS; do
	case "$p" in
	toron | nginx) ;;
	*) echo "isolation-nginx: PEERS holds toron and/or nginx, got $p" >&2; exit 2 ;;
	esac
done

bash scripts/install-bench-deps.sh

tmp_prefix=toron-isolation
# shellcheck source=scripts/lib.sh
source scripts/lib.sh

case " $PEERS " in
*" toron "*)
	echo "isolation-nginx: building bin/toron and the loadtest binary"
	make -s build >/dev/null
	;;
*) echo "isolation-nginx: building the loadtest binary" ;;
esac
go build -o "$tmp/loadtest" ./loadtest

declare -A rc result
for p in $PEERS; do
	echo
	echo "isolation-nginx: $p: $ROUNDS rounds of $DURATION idle + $DURATION saturated"
	# In the background so that the trap can stop it (it then stops the server it started).
	"$tmp/loadtest" -scenario isolation -peer "$p" -toron bin/toron -duration "$DURATION" -rounds "$ROUNDS" \
		-out "$OUT" >"$tmp/$p.log" 2>&1 &
	pids+=($!)
	set +e
	wait "$!"
	rc[$p]=$?
	set -e
	cat "$tmp/$p.log"
	if [ "${rc[$p]}" != 0 ] && [ "${rc[$p]}" != 3 ]; then
		echo "isolation-nginx: the $p run failed (exit ${rc[$p]})" >&2
		exit 1
	fi
	result[$p]=$(grep '^RESULT isolation ' "$tmp/$p.log" || true)
done

field() { # peer key
	sed -n "s/.* $2=\([^ ]*\).*/\1/p" <<<"${result[$1]}"
}

table=$OUT/isolation-compare.md
{
	echo "| server | /api p99 idle | /api p99 saturated | ratio (target ≤ 1.5) | rounds, idle → saturated (ms) | /api errors | /health errors | /health p99 idle → saturated | flood answered 503 (reached the upstream) | slow calls answered 200 | peak RSS | other processes' CPU, max of phases | all checks |"
	echo "|---|---:|---:|---:|---|---:|---:|---|---:|---:|---:|---:|---|"
	for p in $PEERS; do
		verdict=PASS
		[ "${rc[$p]}" = 0 ] || verdict=FAIL
		rounds=$(paste -d' ' <(tr , '\n' <<<"$(field "$p" rounds_idle_ms)") <(tr , '\n' <<<"$(field "$p" rounds_saturated_ms)") |
			awk '{ printf "%s%.2f → %.2f", (NR > 1 ? ", " : ""), $1, $2 }')
		printf '| %s | %.2f ms | %.2f ms | %s | %s | %s of %s | %s of %s | %.2f → %.2f ms | %s of %s (%s) | %s of %s | %s MiB | %s%% | %s |\n' \
			"$p" "$(field "$p" api_p99_idle_ms)" "$(field "$p" api_p99_saturated_ms)" "$(field "$p" ratio)" "$rounds" \
			"$(field "$p" api_errors)" "$(field "$p" api_requests)" "$(field "$p" health_errors)" "$(field "$p" health_requests)" \
			"$(field "$p" health_p99_idle_ms)" "$(field "$p" health_p99_saturated_ms)" \
			"$(field "$p" flood_503)" "$(field "$p" flood_requests)" "$(field "$p" flood_at_upstream)" "$(field "$p" holders_ok)" "$(field "$p" holders)" \
			"$(field "$p" peak_rss_mib)" "$(field "$p" other_cpu_max_pct)" "$verdict"
	done
} >"$table"

echo
echo "## Isolation: $PEERS; medians of $ROUNDS rounds of $DURATION idle + $DURATION saturated"
echo
cat "$table"
echo
echo "other processes' CPU: share of the machine (both cores) that processes other than the load test and the"
echo "server used during a measured phase; above 10% a round measures them too (see each run's round notes)."
echo "machine load average after the runs: $(cut -d' ' -f1-3 /proc/loadavg)"
echo "table: $table; plots: $OUT/isolation.html, $OUT/isolation-nginx.html"
if [ "${rc[toron]:-0}" = 3 ]; then
	exit 3
fi
