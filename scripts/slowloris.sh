#!/usr/bin/env bash
# Slowloris measurement of admission (SPEC 4, BENCHMARKS.md): Toron with its DEFAULT settings
# (worker_pool_size 128, max_connections 8192, read_timeout 5s) on loopback in front of the load
# test's upstream, attacked by slowhttptest in slow-headers mode with CONNECTIONS connections,
# while /health and /api are probed every PROBE_INTERVAL on a new connection each, with a
# PROBE_TIMEOUT limit. It prints the share of probes answered 200 (the target is >= 99%), and the
# same against nginx with a comparable configuration (loadtest/peers/nginx.conf) for reference.
#
#   bash scripts/slowloris.sh             # make bench calls this
#   NGINX=0 LENGTH=15 bash scripts/slowloris.sh
#
# Every process it starts is stopped on exit (trap); every run is bounded by LENGTH (plus a
# margin enforced with timeout). Only 127.0.0.1 is targeted.
set -euo pipefail
cd "$(dirname "$0")/.."

CONNECTIONS=${CONNECTIONS:-1000}  # slowhttptest -c
RATE=${RATE:-200}                 # slowhttptest -r: new connections per second
FOLLOWUP=${FOLLOWUP:-4}           # slowhttptest -i: seconds between two header lines
LENGTH=${LENGTH:-30}              # slowhttptest -l: seconds of attack
PROBE_INTERVAL=${PROBE_INTERVAL:-50ms}
PROBE_TIMEOUT=${PROBE_TIMEOUT:-1s}
NGINX=${NGINX:-1}                 # 0: Toron only
BASE_PORT=${BASE_PORT:-18190}     # upstream, toron, nginx: BASE_PORT .. BASE_PORT+2
OUT=${OUT:-out/slowloris}

tmp_prefix=toron-slowloris
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
need_ints CONNECTIONS RATE FOLLOWUP LENGTH
if [ "$LENGTH" -lt 5 ] || [ "$LENGTH" -gt 300 ] || [ "$CONNECTIONS" -gt 20000 ]; then
	echo "slowloris: LENGTH must be 5..300 seconds and CONNECTIONS at most 20000" >&2
	exit 2
fi

bash scripts/install-bench-deps.sh
# slowhttptest needs a descriptor per connection.
ulimit -n 65536 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null || true

UP_PORT=$BASE_PORT
TORON_PORT=$((BASE_PORT + 1))
NGINX_PORT=$((BASE_PORT + 2))
ports_free $UP_PORT $TORON_PORT $NGINX_PORT

build_bins

"$LT" -scenario upstream -listen "127.0.0.1:$UP_PORT" -lifetime 1h >"$tmp/upstream.log" 2>&1 &
pids+=($!)
wait_http "http://127.0.0.1:$UP_PORT/api/items" upstream

PORT=$TORON_PORT PREFIX=$tmp
fill loadtest/peers/toron-config.yaml "$tmp/toron-config.yaml"
fill loadtest/peers/toron-routes.yaml "$tmp/toron-routes.yaml"
env -u TORON_CONFIG -u TORON_ROUTES bin/toron -config "$tmp/toron-config.yaml" -routes "$tmp/toron-routes.yaml" >"$tmp/toron.log" 2>&1 &
TORON_PID=$!
pids+=("$TORON_PID")
wait_http "http://127.0.0.1:$TORON_PORT/health" toron

servers=(toron)
declare -A port=([toron]=$TORON_PORT)
if [ "$NGINX" = 1 ]; then
	PORT=$NGINX_PORT PREFIX=$tmp/nginx
	mkdir -p "$PREFIX"
	chmod 755 "$PREFIX"
	fill loadtest/peers/nginx.conf "$PREFIX/nginx.conf"
	nginx -p "$PREFIX" -c "$PREFIX/nginx.conf" -e "$PREFIX/error.log" >"$tmp/nginx.out" 2>&1 &
	pids+=($!)
	wait_http "http://127.0.0.1:$NGINX_PORT/health" nginx
	servers+=(nginx)
	port[nginx]=$NGINX_PORT
fi

mkdir -p "$OUT"
probe_seconds=$((LENGTH - 2))
declare -A health api maxconn
for s in "${servers[@]}"; do
	url="http://127.0.0.1:${port[$s]}"
	echo "slowloris: $s: slowhttptest -H -c $CONNECTIONS -r $RATE -i $FOLLOWUP -l $LENGTH against $url/api/x; probing for ${probe_seconds}s"
	timeout $((LENGTH + 30)) slowhttptest -H -c "$CONNECTIONS" -r "$RATE" -i "$FOLLOWUP" -l "$LENGTH" -p 1 \
		-g -o "$tmp/slowhttptest-$s" -u "$url/api/x" >"$tmp/slowhttptest-$s.log" 2>&1 &
	attack=$!
	pids+=("$attack")
	sleep 1
	probe_out=$("$LT" -scenario probe -target "$url" -paths /health,/api/probe -duration "${probe_seconds}s" \
		-interval "$PROBE_INTERVAL" -probe-timeout "$PROBE_TIMEOUT" -label "$s" -out "$OUT" 2>&1 || true)
	wait "$attack" 2>/dev/null || true
	echo "$probe_out" | grep -E '^\|' || true
	health[$s]=$(sed -n "s/^[A-Z]* $s \/health: \([0-9.]*\)% .*/\1/p" <<<"$probe_out")
	api[$s]=$(sed -n "s/^[A-Z]* $s \/api\/probe: \([0-9.]*\)% .*/\1/p" <<<"$probe_out")
	if [ -f "$tmp/slowhttptest-$s.csv" ]; then
		cp "$tmp/slowhttptest-$s.csv" "$OUT/"
		maxconn[$s]=$(awk -F, 'NR > 1 && $4 + 0 > m { m = $4 + 0 } END { print m + 0 }' "$tmp/slowhttptest-$s.csv")
	else
		maxconn[$s]="?"
	fi
	# Let the server close what is left of the crowd before the next one.
	sleep 2
done

table=$OUT/slowloris.md
{
	echo "| server | /health answered 200 | /api answered 200 | target | slowloris connections open at most |"
	echo "|---|---:|---:|---|---:|"
	for s in "${servers[@]}"; do
		verdict=PASS
		for v in "${health[$s]:-0}" "${api[$s]:-0}"; do
			awk -v v="$v" 'BEGIN { exit !(v >= 99) }' || verdict=FAIL
		done
		printf '| %s | %s%% | %s%% | >= 99%%: %s | %s |\n' "$s" "${health[$s]:-?}" "${api[$s]:-?}" "$verdict" "${maxconn[$s]}"
	done
} >"$table"

echo
echo "## Slowloris: slowhttptest -H -c $CONNECTIONS -r $RATE -i $FOLLOWUP -l $LENGTH; probes every $PROBE_INTERVAL, $PROBE_TIMEOUT timeout, new connection each"
echo
cat "$table"
echo
echo "table: $table; probe plots: $OUT/probe-*.html; connection states: $OUT/slowhttptest-*.csv"
