#!/usr/bin/env bash
# Paired A/B of two Toron builds, with nginx in the same rounds (BENCHMARKS.md, issue 15): on
# this kind of shared VM a proxy's CPU per request moves by half from one run to the next, so
# a change is judged by the two builds running at once and measured in turn, round after round,
# and by the per-round ratio's median.
#
#   bash scripts/ab.sh OLD_BINARY [NEW_BINARY]      # NEW_BINARY defaults to bin/toron
#   make bench-ab OLD=/tmp/toron-before             # the same
#   git worktree add /tmp/old HEAD~3 && (cd /tmp/old && go build -o /tmp/toron-before .)
#
# Environment: ROUNDS (9), DURATION (3 seconds per wrk run), CONNECTIONS (64), LOG (0; 1
# turns the access log on for both builds), PROXY_CPU (0), LOAD_CPU (1), BASE_PORT (18380).
# Placement as in scripts/compare.sh: the proxies and the upstream on core PROXY_CPU, wrk on
# LOAD_CPU. Per round and target: the proxy's CPU µs per small GET (utime+stime of its
# processes around the wrk run) and the p99. Every process started here is stopped on exit.
set -euo pipefail
cd "$(dirname "$0")/.."

OLD=${1:?usage: scripts/ab.sh OLD_BINARY [NEW_BINARY]}
NEW=${2:-bin/toron}
ROUNDS=${ROUNDS:-9}
DURATION=${DURATION:-3}
CONNECTIONS=${CONNECTIONS:-64}
LOG=${LOG:-0}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BASE_PORT=${BASE_PORT:-18380}
tmp_prefix=toron-ab
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
need_ints ROUNDS DURATION CONNECTIONS LOG BASE_PORT
for b in "$OLD" "$NEW"; do
	[ -x "$b" ] || { echo "ab: $b is not an executable (make build makes bin/toron)" >&2; exit 2; }
done

bash scripts/install-bench-deps.sh

UP_PORT=$BASE_PORT OLD_PORT=$((BASE_PORT + 1)) NEW_PORT=$((BASE_PORT + 2)) NGINX_PORT=$((BASE_PORT + 3))
ports_free $UP_PORT $OLD_PORT $NEW_PORT $NGINX_PORT
go build -o "$tmp/loadtest" ./loadtest
taskset -c "$PROXY_CPU" "$tmp/loadtest" -scenario upstream -listen "127.0.0.1:$UP_PORT" -lifetime 2h >"$tmp/upstream.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$UP_PORT/api/items" upstream

declare -A pid port
start_toron() { # name binary port
	PORT=$3 PREFIX=$tmp
	fill loadtest/peers/toron-config.yaml "$tmp/$1-config.yaml"
	fill loadtest/peers/toron-routes.yaml "$tmp/$1-routes.yaml"
	if [ "$LOG" = 1 ]; then
		sed -i -e 's/^\(  level:\).*/\1 info/' -e 's/^\(  access:\).*/\1 true/' "$tmp/$1-config.yaml"
	fi
	env -u TORON_CONFIG -u TORON_ROUTES taskset -c "$PROXY_CPU" "$2" -config "$tmp/$1-config.yaml" -routes "$tmp/$1-routes.yaml" >"$tmp/$1.out" 2>"$tmp/$1.err" &
	pid[$1]=$! port[$1]=$3
	pids+=("${pid[$1]}")
	wait_http "http://127.0.0.1:$3/health" "$1"
}
start_toron old "$OLD" "$OLD_PORT"
start_toron new "$NEW" "$NEW_PORT"
PORT=$NGINX_PORT PREFIX=$tmp/nginx
mkdir -p "$PREFIX" && chmod 755 "$PREFIX"
fill loadtest/peers/nginx.conf "$PREFIX/nginx.conf"
taskset -c "$PROXY_CPU" nginx -p "$PREFIX" -c "$PREFIX/nginx.conf" -e "$PREFIX/error.log" >"$tmp/nginx.out" 2>&1 &
pid[nginx]=$! port[nginx]=$NGINX_PORT
pids+=("${pid[nginx]}")
wait_http "http://127.0.0.1:$NGINX_PORT/health" nginx

clk=$(getconf CLK_TCK)
for t in old new nginx; do # warm-up
	taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNECTIONS" -d1s "http://127.0.0.1:${port[$t]}/api/items" >/dev/null
done
echo "ab: $ROUNDS rounds of ${DURATION}s, wrk -t1 -c$CONNECTIONS, access log $([ "$LOG" = 1 ] && echo on || echo off); old $OLD, new $NEW"
: >"$tmp/rounds"
for r in $(seq "$ROUNDS"); do
	line="round $r"
	for t in old new nginx; do
		mapfile -t tree < <(proc_tree "${pid[$t]}")
		a=$(cpu_ticks "${tree[@]}")
		read -r rps p99 < <(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNECTIONS" -d"${DURATION}s" --latency "http://127.0.0.1:${port[$t]}/api/items" |
			awk '/^Requests\/sec/{r=$2} / 99%/{p=$2} END{print r, p}')
		b=$(cpu_ticks "${tree[@]}")
		us=$(awk -v t=$((b - a)) -v k="$clk" -v r="$rps" -v d="$DURATION" 'BEGIN{printf "%.1f", t/k*1e6/(r*d)}')
		echo "$r $t $us" >>"$tmp/rounds"
		line="$line  $t $us µs ($p99)"
	done
	echo "$line"
done
awk '
	{ v[$1, $2] = $3; n = $1 }
	function median(a, k,   i, j, x) {
		for (i = 2; i <= k; i++) { x = a[i]; for (j = i - 1; j >= 1 && a[j] > x; j--) a[j + 1] = a[j]; a[j + 1] = x }
		return k % 2 ? a[(k + 1) / 2] : (a[k / 2] + a[k / 2 + 1]) / 2
	}
	END {
		for (i = 1; i <= n; i++) { o[i] = v[i, "old"]; w[i] = v[i, "new"]; g[i] = v[i, "nginx"]; r1[i] = w[i] / o[i]; r2[i] = w[i] / g[i]; r3[i] = o[i] / g[i]; if (w[i] < o[i]) wins++ }
		printf "medians: old %.1f µs, new %.1f µs, nginx %.1f µs\n", median(o, n), median(w, n), median(g, n)
		printf "per-round medians: new / old %.3f (new cheaper in %d of %d rounds), new / nginx %.2f, old / nginx %.2f\n", median(r1, n), wins, n, median(r2, n), median(r3, n)
	}' "$tmp/rounds"
