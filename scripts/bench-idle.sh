#!/usr/bin/env bash
# Memory per idle keep-alive client connection (SPEC 22, issue 32, BENCHMARKS.md): Toron, nginx,
# HAProxy and a bare fasthttp server (the floor: fasthttp's Server with ReduceMemoryUsage and a
# handler that answers a fixed body), each sent CONNS connections that make one small GET and
# then wait, silent. The figure is the RSS growth of the server's processes divided by CONNS,
# read DURATION seconds after the last answer (loadtest -scenario idle). Over TLS: Toron and
# nginx on one ECDSA P-256 certificate made for the run.
#
#   bash scripts/bench-idle.sh                 # make bench-idle: 10,000 connections
#   CONNS=50000 bash scripts/bench-idle.sh     # where the machine allows
#   CONNS=5000 TLS=0 bash scripts/bench-idle.sh
#
# Every server gets keep-alive timeouts long enough for the measurement (120 s), and enough
# connections and file descriptors for CONNS; everything else is as in the peer comparison
# (loadtest/peers/). Each server runs alone, started fresh, one after the other, so none sees the
# others' connections. Targets (SPEC 22): Toron at most 8 KiB per idle connection, 16 KiB over
# TLS. Every process this script starts is stopped on exit (trap). Only 127.0.0.1 is targeted.
set -euo pipefail
cd "$(dirname "$0")/.."

CONNS=${CONNS:-10000}
DURATION=${DURATION:-5}           # seconds between the last answer and the second RSS reading
TLS=${TLS:-1}
BASE_PORT=${BASE_PORT:-18290}     # upstream, server under test: BASE_PORT, BASE_PORT+1
OUT=${OUT:-out/bench-idle}

tmp_prefix=toron-bench-idle
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
need_ints CONNS DURATION TLS
if [ "$CONNS" -lt 100 ] || [ "$CONNS" -gt 100000 ]; then
	echo "bench-idle: CONNS must be 100..100000" >&2
	exit 2
fi

bash scripts/install-bench-deps.sh
# Each process (the client, the server) needs CONNS descriptors and some more. Raise the soft
# limit to the hard one; a hard limit below that is the machine's, and the run says so (this
# sandbox's hard limit is 20,000, so 50,000 connections cannot be measured here).
need=$((CONNS + 500))
ulimit -n "$(ulimit -Hn)" 2>/dev/null || true
if [ "$(ulimit -n)" != unlimited ] && [ "$(ulimit -n)" -lt "$need" ]; then
	echo "bench-idle: $CONNS connections need $need open files per process; the hard limit here is $(ulimit -Hn)" >&2
	exit 1
fi

UP_PORT=$BASE_PORT
PORT=$((BASE_PORT + 1))
ports_free $UP_PORT $PORT

build_bins

CERT=$tmp/cert.pem
KEY=$tmp/key.pem
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
	-subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
	-keyout "$KEY" -out "$CERT" 2>/dev/null
chmod 644 "$CERT" "$KEY"

spawn "$tmp/upstream.log" "$LT" -scenario upstream -listen "127.0.0.1:$UP_PORT" -lifetime 2h
wait_http "http://127.0.0.1:$UP_PORT/api/items" upstream

mkdir -p "$OUT"
results=$OUT/idle.tsv
printf 'server\tconns\tkib_per_conn\n' >"$results"

# stop PID: stop one server under test and wait for it.
stop() {
	kill -TERM "$1" 2>/dev/null || true
	reap "$1"
}

# measure LABEL PID [loadtest flags...]: one idle run against the server with that pid.
measure() {
	local label=$1 pid=$2 line
	shift 2
	line=$("$LT" -scenario idle -label "$label" -pid "$pid" -connections "$CONNS" -duration "${DURATION}s" -paths /api/items "$@")
	echo "$line"
	printf '%s\t%s\t%s\n' "$label" "$CONNS" "$(sed -E 's/.*kib_per_conn=([0-9.]+).*/\1/' <<<"$line")" >>"$results"
	stop "$pid"
}

toron_config() { # out tls
	{
		printf 'server:\n  host: "127.0.0.1"\n  port: %s\n  drain_delay: 0s\n  shutdown_timeout: 2s\n' "$PORT"
		printf '  idle_timeout: 120s\n  max_connections: %s\n' "$((CONNS * 2))"
		if [ "$2" = 1 ]; then
			printf '  tls:\n    certs:\n      - {cert_file: "%s", key_file: "%s"}\n' "$CERT" "$KEY"
		fi
		printf 'log:\n  level: warn\n  access: false\n'
	} >"$1"
}
PREFIX=$tmp
fill loadtest/peers/toron-routes.yaml "$tmp/toron-routes.yaml"

nginx_conf() { # template out
	fill "$1" "$2" -e "s|@PLAIN_PORT@|$((BASE_PORT + 2))|g" -e "s|@CERT@|$CERT|g" -e "s|@KEY@|$KEY|g" \
		-e "s|worker_connections [0-9]*;|worker_connections $((CONNS * 2 + 100));|" \
		-e "s|keepalive_timeout 5s;|keepalive_timeout 120s;|" \
		-e "s|^worker_processes 1;|worker_processes 1;\nworker_rlimit_nofile $need;|"
}

# Toron, plaintext (TORON=path: another build).
toron_config "$tmp/toron.yaml" 0
spawn "$tmp/toron.log" env -u TORON_CONFIG -u TORON_ROUTES "${TORON:-bin/toron}" -config "$tmp/toron.yaml" -routes "$tmp/toron-routes.yaml"
pid=$spawned
wait_http "http://127.0.0.1:$PORT/health" toron
measure toron "$pid" -target "http://127.0.0.1:$PORT"

# The floors: a bare fasthttp server with ReduceMemoryUsage, with StreamRequestBody as Toron's
# server needs it (fasthttp then keeps the read buffer of an idle connection), and without.
for stream in true false; do
	spawn "$tmp/bare.log" "$LT" -scenario bare-server -bare-stream=$stream -listen "127.0.0.1:$PORT" -lifetime 2h
	pid=$spawned
	wait_http "http://127.0.0.1:$PORT/api/items" bare-fasthttp
	if [ $stream = true ]; then label=bare-fasthttp-stream; else label=bare-fasthttp-buffered; fi
	measure "$label" "$pid" -target "http://127.0.0.1:$PORT"
done

# nginx.
mkdir -p "$tmp/nginx"
chmod 755 "$tmp/nginx"
PREFIX=$tmp/nginx
nginx_conf loadtest/peers/nginx.conf "$tmp/nginx/nginx.conf"
spawn "$tmp/nginx.out" nginx -p "$tmp/nginx" -c "$tmp/nginx/nginx.conf" -e "$tmp/nginx/error.log"
pid=$spawned
wait_http "http://127.0.0.1:$PORT/health" nginx
measure nginx "$pid" -target "http://127.0.0.1:$PORT"

# HAProxy.
PREFIX=$tmp
# HAProxy reserves two descriptors per connection (client and server side) and refuses to
# start when the hard limit is below that; idle client connections have no server side, so it
# is told to run with what the machine gives (no strict-limits).
fill loadtest/peers/haproxy.cfg "$tmp/haproxy.cfg" \
	-e "s|maxconn 8192|maxconn $((CONNS + 100))\n    ulimit-n $(($(ulimit -Hn) - 100))\n    no strict-limits|" \
	-e "s|timeout http-keep-alive 5s|timeout http-keep-alive 120s|" -e "s|timeout client 5s|timeout client 120s|"
spawn "$tmp/haproxy.log" haproxy -db -f "$tmp/haproxy.cfg"
pid=$spawned
wait_http "http://127.0.0.1:$PORT/health" haproxy
measure haproxy "$pid" -target "http://127.0.0.1:$PORT"

if [ "$TLS" = 1 ]; then
	toron_config "$tmp/toron-tls.yaml" 1
	spawn "$tmp/toron-tls.log" env -u TORON_CONFIG -u TORON_ROUTES "${TORON:-bin/toron}" -config "$tmp/toron-tls.yaml" -routes "$tmp/toron-routes.yaml"
	pid=$spawned
	wait_http "https://127.0.0.1:$PORT/health" toron-tls -k
	measure toron-tls "$pid" -tls-target "127.0.0.1:$PORT"

	spawn "$tmp/bare-tls.log" "$LT" -scenario bare-server -cert "$CERT" -key "$KEY" -listen "127.0.0.1:$PORT" -lifetime 2h
	pid=$spawned
	wait_http "https://127.0.0.1:$PORT/api/items" bare-fasthttp-tls -k
	measure bare-fasthttp-stream-tls "$pid" -tls-target "127.0.0.1:$PORT"

	PREFIX=$tmp/nginx
	nginx_conf loadtest/peers/nginx-tls.conf "$tmp/nginx/nginx-tls.conf"
	spawn "$tmp/nginx-tls.out" nginx -p "$tmp/nginx" -c "$tmp/nginx/nginx-tls.conf" -e "$tmp/nginx/error.log"
	pid=$spawned
	wait_http "https://127.0.0.1:$PORT/health" nginx-tls -k
	measure nginx-tls "$pid" -tls-target "127.0.0.1:$PORT"
fi

echo
echo "bench-idle: KiB of RSS per idle keep-alive connection, $CONNS connections (targets: Toron 8, Toron TLS 16)"
column -t "$results"
