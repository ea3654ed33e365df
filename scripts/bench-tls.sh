#!/usr/bin/env bash
# TLS comparison (SPEC 14, BENCHMARKS.md): Toron and nginx terminating TLS with the same ECDSA
# P-256 certificate (made for the run with openssl), in front of the same upstream, measured in
# one run on loopback, targets interleaved over ROUNDS rounds, medians reported.
#
#   bash scripts/bench-tls.sh          # make bench-tls (and make bench) call this
#   ROUNDS=1 DURATION=5 bash scripts/bench-tls.sh
#
# Per target and round, three wrk runs (one thread, on core LOAD_CPU):
#   plain       the same as keep-alive without TLS (a second Toron process with the same routes;
#               a second, plain listen line of the same nginx server): the baseline, so that the
#               table shows what TLS itself adds per request;
#   keep-alive  CONNECTIONS TLS connections, small GET /api/items: req/s and the proxy's CPU
#               time per request (utime+stime of its processes from /proc/PID/stat around the run);
#   new-conn    NEW_CONNECTIONS connections, each request with `Connection: close`, so every
#               request is a new TCP connection and a full TLS handshake (TLS 1.3, as wrk's
#               OpenSSL and both servers negotiate it; wrk does not resume sessions): connections
#               per second and CPU per connection.
# The handshake's CPU cost is the new-conn CPU per request minus the keep-alive one.
# Targets (SPEC 14): Toron's keep-alive CPU/request at most 1.2x nginx's; Toron's new connections
# per second at least 0.7x nginx's.
#
# Placement: the proxy and the upstream share core PROXY_CPU (taskset). Configurations:
# loadtest/peers/toron-tls-config.yaml, toron-routes.yaml and nginx-tls.conf. Every process this
# script starts is stopped on exit (trap). Only 127.0.0.1 is targeted.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}          # seconds per wrk run
CONNECTIONS=${CONNECTIONS:-64}
NEW_CONNECTIONS=${NEW_CONNECTIONS:-16}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BASE_PORT=${BASE_PORT:-18190}     # upstream, toron, nginx, plain toron, plain nginx: BASE_PORT .. BASE_PORT+4
OUT=${OUT:-out/bench-tls}

tmp_prefix=toron-bench-tls
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
need_ints ROUNDS DURATION CONNECTIONS NEW_CONNECTIONS
need_rounds_duration

bash scripts/install-bench-deps.sh

UP_PORT=$BASE_PORT
TORON_PORT=$((BASE_PORT + 1))
NGINX_PORT=$((BASE_PORT + 2))
TORON_PLAIN_PORT=$((BASE_PORT + 3))
NGINX_PLAIN_PORT=$((BASE_PORT + 4))
ports_free $UP_PORT $TORON_PORT $NGINX_PORT $TORON_PLAIN_PORT $NGINX_PLAIN_PORT

# One ECDSA P-256 certificate for both servers, made now, removed with $tmp.
CERT=$tmp/cert.pem
KEY=$tmp/key.pem
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 2 \
	-subj /CN=localhost -addext "subjectAltName=DNS:localhost,IP:127.0.0.1" \
	-keyout "$KEY" -out "$CERT" 2>/dev/null
chmod 644 "$CERT" "$KEY" # nginx's worker (nobody) reads them at start through the master

fill_tls() { # template out: fill (lib.sh) with nginx's plain port and the certificate
	fill "$1" "$2" -e "s|@PLAIN_PORT@|$NGINX_PLAIN_PORT|g" -e "s|@CERT@|$CERT|g" -e "s|@KEY@|$KEY|g"
}

build_bins
CLK_TCK=$(getconf CLK_TCK)

spawn "$tmp/upstream.log" taskset -c "$PROXY_CPU" "$LT" -scenario upstream -listen "127.0.0.1:$UP_PORT" -lifetime 2h
wait_http "http://127.0.0.1:$UP_PORT/api/items" upstream

PORT=$TORON_PORT PREFIX=$tmp
fill_tls loadtest/peers/toron-tls-config.yaml "$tmp/toron-config.yaml"
fill_tls loadtest/peers/toron-routes.yaml "$tmp/toron-routes.yaml"
spawn_toron "$tmp/toron.log" "$tmp/toron-config.yaml" "$tmp/toron-routes.yaml"
TORON_PID=$spawned
wait_http "https://127.0.0.1:$TORON_PORT/health" toron --cacert "$CERT"

PORT=$TORON_PLAIN_PORT PREFIX=$tmp
fill_tls loadtest/peers/toron-config.yaml "$tmp/toron-plain-config.yaml"
spawn_toron "$tmp/toron-plain.log" "$tmp/toron-plain-config.yaml" "$tmp/toron-routes.yaml"
TORON_PLAIN_PID=$spawned
wait_http "http://127.0.0.1:$TORON_PLAIN_PORT/health" "plain toron"

NGINX=$(command -v nginx || echo /usr/sbin/nginx)
PORT=$NGINX_PORT PREFIX=$tmp/nginx
mkdir -p "$PREFIX"
chmod 755 "$PREFIX"
fill_tls loadtest/peers/nginx-tls.conf "$PREFIX/nginx.conf"
spawn_nginx "$tmp/nginx.out" "$PREFIX" "$NGINX"
NGINX_PID=$spawned
wait_http "https://127.0.0.1:$NGINX_PORT/health" nginx --cacert "$CERT"

# What each server negotiates with an OpenSSL client (curl): protocol and ALPN.
for t in toron nginx; do
	p=$TORON_PORT
	[ "$t" = nginx ] && p=$NGINX_PORT
	echo "bench-tls: $t: $(curl -s -o /dev/null --cacert "$CERT" -w '%{http_version}' "https://localhost:$p/api/items") over $(echo | openssl s_client -connect "127.0.0.1:$p" -servername localhost 2>/dev/null | awk '/^New, / {sub(",", "", $2); print $2; exit}')"
done

declare -A port=([toron]=$TORON_PORT [nginx]=$NGINX_PORT)
declare -A plain_port=([toron]=$TORON_PLAIN_PORT [nginx]=$NGINX_PLAIN_PORT)
declare -A root=([toron]=$TORON_PID [nginx]=$NGINX_PID)
declare -A plain_root=([toron]=$TORON_PLAIN_PID [nginx]=$NGINX_PID)
modes=(plain keepalive newconn)

run_wrk() { # target mode duration -> prints "rps requests errors"
	local url="https://127.0.0.1:${port[$1]}/api/items" out
	[ "$2" = plain ] && url="http://127.0.0.1:${plain_port[$1]}/api/items"
	if [ "$2" = newconn ]; then
		out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$NEW_CONNECTIONS" -d"${3}s" --timeout 5s -H 'Connection: close' "$url")
	else
		out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNECTIONS" -d"${3}s" --timeout 5s "$url")
	fi
	wrk_counts "$out"
}

echo "bench-tls: warming up"
for t in toron nginx; do for m in "${modes[@]}"; do run_wrk "$t" "$m" 2 >/dev/null; done; done

mkdir -p "$OUT"
raw=$OUT/rounds.tsv
printf 'round\ttarget\tmode\treq_per_s\trequests\terrors\tcpu_us_per_req\n' >"$raw"
for round in $(seq "$ROUNDS"); do
	order=(toron nginx)
	[ $((round % 2)) -eq 0 ] && order=(nginx toron)
	for t in "${order[@]}"; do
		for m in "${modes[@]}"; do
			r=${root[$t]}
			[ "$m" = plain ] && r=${plain_root[$t]}
			mapfile -t tree < <(echo "$r"; children "$r")
			before=$(cpu_ticks "${tree[@]}")
			read -r rps reqs errs < <(run_wrk "$t" "$m" "$DURATION")
			after=$(cpu_ticks "${tree[@]}")
			cpu=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v n="$reqs" 'BEGIN { if (n > 0) printf "%.1f", d * 1e6 / hz / n; else print "-" }')
			printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$t" "$m" "$rps" "$reqs" "$errs" "$cpu" >>"$raw"
			printf 'bench-tls: round %s %-6s %-9s %10s req/s  errors %s  cpu %7s us/req\n' "$round" "$t" "$m" "$rps" "$errs" "$cpu"
		done
	done
done

col() { awk -F'\t' -v t="$1" -v m="$2" -v c="$3" 'NR > 1 && $2 == t && $3 == m && $c != "-" { print $c }' "$raw" | median; }
sub() { awk -v a="$1" -v b="$2" 'BEGIN { if (a == "-" || b == "-") print "-"; else printf "%.1f", a - b }'; }

declare -A pl_cpu tls_cost ka_rps ka_cpu nc_rps nc_cpu hs
for t in toron nginx; do
	pl_cpu[$t]=$(col "$t" plain 7)
	ka_rps[$t]=$(col "$t" keepalive 4)
	ka_cpu[$t]=$(col "$t" keepalive 7)
	nc_rps[$t]=$(col "$t" newconn 4)
	nc_cpu[$t]=$(col "$t" newconn 7)
	hs[$t]=$(sub "${nc_cpu[$t]}" "${ka_cpu[$t]}")
	tls_cost[$t]=$(sub "${ka_cpu[$t]}" "${pl_cpu[$t]}")
done
cpu_ratio=$(ratio "${ka_cpu[toron]}" "${ka_cpu[nginx]}")
conn_ratio=$(ratio "${nc_rps[toron]}" "${nc_rps[nginx]}")
table=$OUT/bench-tls.md
{
	echo "| target | plaintext CPU µs/req | TLS keep-alive req/s | TLS keep-alive CPU µs/req | TLS adds µs/req | new TLS conns/s | CPU µs/new conn | handshake CPU µs (new conn − keep-alive) | errors |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---|"
	for t in toron nginx; do
		errs=$(awk -F'\t' -v t="$t" 'NR > 1 && $2 == t { e += $6 } END { print e + 0 }' "$raw")
		printf '| %s | %s | %.0f | %s | %s | %.0f | %s | %s | %s |\n' "$t" "${pl_cpu[$t]}" "${ka_rps[$t]}" "${ka_cpu[$t]}" "${tls_cost[$t]}" "${nc_rps[$t]}" "${nc_cpu[$t]}" "${hs[$t]}" "$errs"
	done
	echo
	echo "toron / nginx: TLS keep-alive CPU per request $cpu_ratio (target <= 1.2; plaintext $(ratio "${pl_cpu[toron]}" "${pl_cpu[nginx]}")); new TLS connections per second $conn_ratio (target >= 0.7)"
} >"$table"

echo
echo "## TLS comparison: medians of $ROUNDS interleaved rounds"
echo
echo "wrk -t1 on core $LOAD_CPU (keep-alive: -c$CONNECTIONS; new connections: -c$NEW_CONNECTIONS, Connection: close), ${DURATION}s per run;"
echo "proxy and upstream on core $PROXY_CPU; one ECDSA P-256 certificate for both; load average after: $(cut -d' ' -f1-3 /proc/loadavg)."
echo
cat "$table"
echo
echo "RESULT tls keepalive_cpu_ratio=$cpu_ratio newconn_rate_ratio=$conn_ratio toron_handshake_us=${hs[toron]} nginx_handshake_us=${hs[nginx]} toron_tls_adds_us=${tls_cost[toron]} nginx_tls_adds_us=${tls_cost[nginx]}"
echo "per-round values: $raw; table: $table"
