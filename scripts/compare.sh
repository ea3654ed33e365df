#!/usr/bin/env bash
# Peer comparison (SPEC 10, BENCHMARKS.md): the upstream directly, Toron (access log off, and
# on at its default settings: level info, JSON lines to a file), nginx, HAProxy and two
# references, the loadtest's naive fasthttp proxy (Server + HostClient) and its TCP relay,
# measured in one run on loopback, targets interleaved over ROUNDS rounds, medians reported as
# ratios against the direct request, and Toron's ratios to each peer (issue 15).
#
#   bash scripts/compare.sh            # make bench calls this
#   ROUNDS=1 DURATION=5 bash scripts/compare.sh
#   UPLOADS=0 ROUNDS=5 bash scripts/compare.sh   # small GETs only
#
# Per target and round: small GET req/s and p99 (wrk --latency, DURATION seconds, CONNECTIONS
# connections, one thread), the proxy's CPU time per request (utime+stime of its processes from
# /proc/PID/stat around the wrk run), and upload MB/s (UPLOADS concurrent uploads of
# UPLOAD_BYTES, generated on the fly by the loadtest binary, Content-Length; UPLOADS=0 skips
# them). Peak RSS (VmHWM from /proc/PID/status, summed over the proxy's processes) is read at
# the end.
#
# Placement: the proxy and the upstream share core PROXY_CPU (taskset), the load generators run
# on core LOAD_CPU. Configurations: loadtest/peers/ (documented there and in docs/benchmarks.md).
# Every process this script starts is stopped on exit (trap). Only 127.0.0.1 is targeted.
set -euo pipefail
cd "$(dirname "$0")/.."

ROUNDS=${ROUNDS:-3}
DURATION=${DURATION:-10}          # seconds per wrk run
CONNECTIONS=${CONNECTIONS:-64}
UPLOADS=${UPLOADS:-8}
UPLOAD_BYTES=${UPLOAD_BYTES:-200000000}
PROXY_CPU=${PROXY_CPU:-0}
LOAD_CPU=${LOAD_CPU:-1}
BASE_PORT=${BASE_PORT:-18180}     # upstream, toron, nginx, haproxy, naive, relay, toron-log: BASE_PORT .. BASE_PORT+6
OUT=${OUT:-out/compare}

tmp_prefix=toron-compare
# shellcheck source=scripts/lib.sh
source scripts/lib.sh
need_ints ROUNDS DURATION CONNECTIONS UPLOADS UPLOAD_BYTES
need_rounds_duration

bash scripts/install-bench-deps.sh

hwm_kib() { # pids...: summed VmHWM in KiB
	local sum=0 pid v
	for pid in "$@"; do
		v=$(awk '/^VmHWM:/ {print $2}' "/proc/$pid/status" 2>/dev/null || true)
		sum=$((sum + ${v:-0}))
	done
	echo "$sum"
}

UP_PORT=$BASE_PORT
TORON_PORT=$((BASE_PORT + 1))
NGINX_PORT=$((BASE_PORT + 2))
HAPROXY_PORT=$((BASE_PORT + 3))
NAIVE_PORT=$((BASE_PORT + 4))
RELAY_PORT=$((BASE_PORT + 5))
TORON_LOG_PORT=$((BASE_PORT + 6))
ports_free $UP_PORT $TORON_PORT $NGINX_PORT $HAPROXY_PORT $NAIVE_PORT $RELAY_PORT $TORON_LOG_PORT

build_bins
CLK_TCK=$(getconf CLK_TCK)

# The upstream: the load test's own fasthttp server (JSON /api, upload sink).
spawn "$tmp/upstream.log" taskset -c "$PROXY_CPU" "$LT" -scenario upstream -listen "127.0.0.1:$UP_PORT" -lifetime 2h
wait_http "http://127.0.0.1:$UP_PORT/api/items" upstream

# Toron: built-in defaults, logs off.
PORT=$TORON_PORT PREFIX=$tmp
fill loadtest/peers/toron-config.yaml "$tmp/toron-config.yaml"
fill loadtest/peers/toron-routes.yaml "$tmp/toron-routes.yaml"
spawn_toron "$tmp/toron.log" "$tmp/toron-config.yaml" "$tmp/toron-routes.yaml"
TORON_PID=$spawned
wait_http "http://127.0.0.1:$TORON_PORT/health" toron

# Toron with the access log on at its defaults (level info, one JSON line per request), to a
# file as a service manager would keep it.
PORT=$TORON_LOG_PORT PREFIX=$tmp
fill loadtest/peers/toron-config.yaml "$tmp/toron-log-config.yaml"
sed -i -e 's/^\(  level:\).*/\1 info/' -e 's/^\(  access:\).*/\1 true/' "$tmp/toron-log-config.yaml"
grep -q '^  access: true' "$tmp/toron-log-config.yaml" || { echo "compare: could not turn the access log on in $tmp/toron-log-config.yaml" >&2; exit 1; }
env -u TORON_CONFIG -u TORON_ROUTES taskset -c "$PROXY_CPU" bin/toron -config "$tmp/toron-log-config.yaml" -routes "$tmp/toron-routes.yaml" >"$tmp/toron-log.out" 2>"$tmp/toron-access.log" &
TORON_LOG_PID=$!
pids+=("$TORON_LOG_PID")
wait_http "http://127.0.0.1:$TORON_LOG_PORT/health" toron-log

# The references: the loadtest's naive fasthttp proxy and its TCP relay (loadtest/helpers.go,
# loadtest/relay.go), on the proxy's core like the others.
spawn "$tmp/naive.log" taskset -c "$PROXY_CPU" "$LT" -scenario naive-proxy -listen "127.0.0.1:$NAIVE_PORT" -upstream "127.0.0.1:$UP_PORT" -lifetime 2h
NAIVE_PID=$spawned
wait_http "http://127.0.0.1:$NAIVE_PORT/api/items" naive
spawn "$tmp/relay.log" taskset -c "$PROXY_CPU" "$LT" -scenario tcp-relay -listen "127.0.0.1:$RELAY_PORT" -upstream "127.0.0.1:$UP_PORT" -lifetime 2h
RELAY_PID=$spawned
wait_http "http://127.0.0.1:$RELAY_PORT/api/items" relay

# nginx: foreground, temporary prefix.
PORT=$NGINX_PORT PREFIX=$tmp/nginx
mkdir -p "$PREFIX"
chmod 755 "$PREFIX"
fill loadtest/peers/nginx.conf "$PREFIX/nginx.conf"
spawn_nginx "$tmp/nginx.out" "$PREFIX"
NGINX_PID=$spawned
wait_http "http://127.0.0.1:$NGINX_PORT/health" nginx

# HAProxy: foreground (-db), its own file.
PORT=$HAPROXY_PORT PREFIX=$tmp
fill loadtest/peers/haproxy.cfg "$tmp/haproxy.cfg"
spawn "$tmp/haproxy.log" taskset -c "$PROXY_CPU" haproxy -db -f "$tmp/haproxy.cfg"
HAPROXY_PID=$spawned
wait_http "http://127.0.0.1:$HAPROXY_PORT/health" haproxy

targets=(direct toron toron-log nginx haproxy naive relay)
declare -A port=([direct]=$UP_PORT [toron]=$TORON_PORT [toron-log]=$TORON_LOG_PORT [nginx]=$NGINX_PORT [haproxy]=$HAPROXY_PORT [naive]=$NAIVE_PORT [relay]=$RELAY_PORT)
declare -A root=([direct]="" [toron]=$TORON_PID [toron-log]=$TORON_LOG_PID [nginx]=$NGINX_PID [haproxy]=$HAPROXY_PID [naive]=$NAIVE_PID [relay]=$RELAY_PID)

# ms: convert a wrk latency ("812.00us", "1.23ms", "1.02s") to milliseconds.
ms() { awk -v v="$1" 'BEGIN { n = v + 0; if (v ~ /us$/) n /= 1000; else if (v ~ /ms$/) n += 0; else if (v ~ /s$/) n *= 1000; printf "%.3f", n }'; }

mkdir -p "$OUT"
raw=$OUT/rounds.tsv
printf 'round\ttarget\treq_per_s\tp99_ms\trequests\tnon2xx_or_socket_errors\tcpu_us_per_req\tupload_mb_per_s\tupload_failed\tforeign_cpu_percent\n' >"$raw"

run_wrk() { # target duration -> prints "rps p99ms requests errors"
	local url="http://127.0.0.1:${port[$1]}/api/items" out rps p99 reqs errs
	out=$(taskset -c "$LOAD_CPU" wrk -t1 -c"$CONNECTIONS" -d"${2}s" --timeout 5s --latency "$url")
	read -r rps reqs errs <<<"$(wrk_counts "$out")"
	p99=$(awk '$1 == "99%" {print $2}' <<<"$out")
	echo "$rps $(ms "${p99:-0}") $reqs $errs"
}

busy_percent() { # share of all cores busy over one second, from /proc/stat
	local a b
	read -r -a a < <(head -1 /proc/stat)
	sleep 1
	read -r -a b < <(head -1 /proc/stat)
	awk -v u=$((b[1] + b[2] + b[3] + b[6] + b[7] - a[1] - a[2] - a[3] - a[6] - a[7])) \
		-v i=$((b[4] + b[5] - a[4] - a[5])) 'BEGIN { if (u + i > 0) printf "%.0f", 100 * u / (u + i); else print 0 }'
}
busy=$(busy_percent)
echo "compare: machine busy before the run: ${busy}% of all cores (load average $(cut -d' ' -f1-3 /proc/loadavg))"
if [ "$busy" -gt 10 ]; then
	echo "compare: WARNING: other processes use the CPU: the numbers will be noisy; run it on a quiet machine" >&2
fi

core_ticks() { # busy and total ticks of core $1 from /proc/stat
	awk -v c="cpu$1" '$1 == c { print $2 + $3 + $4 + $7 + $8 + $9, $2 + $3 + $4 + $5 + $6 + $7 + $8 + $9 }' /proc/stat
}

echo "compare: warming up"
for t in "${targets[@]}"; do run_wrk "$t" 2 >/dev/null; done

UP_PID=${pids[0]}
for round in $(seq "$ROUNDS"); do
	for t in "${targets[@]}"; do
		tree=()
		[ -n "${root[$t]}" ] && mapfile -t tree < <(proc_tree "${root[$t]}")
		before=$(cpu_ticks "${tree[@]}")
		ours_before=$(cpu_ticks "${tree[@]}" "$UP_PID")
		read -r busy_before total_before < <(core_ticks "$PROXY_CPU")
		read -r rps p99 reqs errs < <(run_wrk "$t" "$DURATION")
		read -r busy_after total_after < <(core_ticks "$PROXY_CPU")
		ours_after=$(cpu_ticks "${tree[@]}" "$UP_PID")
		after=$(cpu_ticks "${tree[@]}")
		cpu="-"
		if [ -n "${root[$t]}" ] && [ "${reqs:-0}" -gt 0 ]; then
			cpu=$(awk -v d=$((after - before)) -v hz="$CLK_TCK" -v n="$reqs" 'BEGIN { printf "%.1f", d * 1e6 / hz / n }')
		fi
		# Other processes on the proxy's core during the wrk run: its busy time that neither the
		# proxy nor the upstream spent. Above a few percent the round was disturbed.
		foreign=$(awk -v b=$((busy_after - busy_before)) -v o=$((ours_after - ours_before)) -v n=$((total_after - total_before)) \
			'BEGIN { f = (n > 0) ? 100 * (b - o) / n : 0; if (f < 0) f = 0; printf "%.0f", f }')
		up_out=""
		if [ "$UPLOADS" -gt 0 ]; then
			up_out=$(taskset -c "$LOAD_CPU" "$LT" -scenario upload -verify=false -target "http://127.0.0.1:${port[$t]}/legacy/upload" \
				-uploads "$UPLOADS" -upload-bytes "$UPLOAD_BYTES" -label "$t" -out "$tmp/upload-$t" 2>&1 || true)
		fi
		mbps=$(sed -n 's/^RESULT upload_mbps=\([0-9.]*\) failed=\([0-9]*\).*/\1/p' <<<"$up_out")
		failed=$(sed -n 's/^RESULT upload_mbps=\([0-9.]*\) failed=\([0-9]*\).*/\2/p' <<<"$up_out")
		printf '%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\t%s\n' "$round" "$t" "$rps" "$p99" "$reqs" "$errs" "$cpu" "${mbps:-0}" "${failed:-?}" "$foreign" >>"$raw"
		printf 'compare: round %s %-9s %10s req/s  p99 %8s ms  errors %s  cpu %6s us/req  upload %8s MB/s (failed %s)  foreign cpu %s%%\n' \
			"$round" "$t" "$rps" "$p99" "$errs" "$cpu" "${mbps:-0}" "${failed:-?}" "$foreign"
	done
done

declare -A rss
for t in toron toron-log nginx haproxy naive relay; do
	mapfile -t tree < <(proc_tree "${root[$t]}")
	rss[$t]=$(hwm_kib "${tree[@]}")
done
rss[direct]=$(hwm_kib "${pids[0]}")

# Medians over the rounds, ratios against direct.
col() { awk -F'\t' -v t="$1" -v c="$2" 'NR > 1 && $2 == t && $c != "-" { print $c }' "$raw" | median; }

d_rps=$(col direct 3)
d_p99=$(col direct 4)
d_up=$(col direct 8)
table=$OUT/compare.md
{
	echo "| target | req/s | vs direct | p99 ms | vs direct | proxy CPU µs/req | upload MB/s | vs direct | peak RSS MiB | errors |"
	echo "|---|---:|---:|---:|---:|---:|---:|---:|---:|---|"
	for t in "${targets[@]}"; do
		rps=$(col "$t" 3)
		p99=$(col "$t" 4)
		cpu=$(col "$t" 7)
		up=$(col "$t" 8)
		errs=$(awk -F'\t' -v t="$t" 'NR > 1 && $2 == t { e += $6; f += $9 } END { printf "%d GET, %d uploads", e, f }' "$raw")
		name=$t
		[ "$t" = direct ] && name="direct (upstream)"
		[ "$t" = toron-log ] && name="toron, access log on"
		[ "$t" = naive ] && name="naive fasthttp proxy"
		[ "$t" = relay ] && name="tcp relay"
		printf '| %s | %.0f | %s | %.2f | %s | %s | %.0f | %s | %.1f | %s |\n' "$name" "$rps" "$(ratio "$rps" "$d_rps")" \
			"$p99" "$(ratio "$p99" "$d_p99")" "$cpu" "$up" "$(ratio "$up" "$d_up")" \
			"$(awk -v k="${rss[$t]}" 'BEGIN { printf "%.1f", k / 1024 }')" "$errs"
	done
} >"$table"

# paired A B: the median over the rounds of A's CPU per request divided by B's in the same
# round. On a shared VM a proxy's CPU moves by half between rounds; the ratio within a round
# moves less (scripts/ab.sh).
paired() {
	awk -F'\t' -v a="$1" -v b="$2" '
		NR > 1 && $2 == a && $7 != "-" { x[$1] = $7 }
		NR > 1 && $2 == b && $7 != "-" { y[$1] = $7 }
		END {
			n = 0
			for (r in x) if ((r in y) && y[r] > 0) v[++n] = x[r] / y[r]
			if (n == 0) { print "-"; exit }
			for (i = 2; i <= n; i++) { t = v[i]; for (j = i - 1; j >= 1 && v[j] > t; j--) v[j + 1] = v[j]; v[j + 1] = t }
			printf "%.2f", n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
		}' "$raw"
}

# Toron against each peer, access log off and on: proxy CPU per request and p99 (medians of
# the rounds), the per-round CPU ratio's median, then the proxy CPU of every round.
vs=$OUT/toron-vs.md
{
	echo "| Toron ÷ | CPU/req, log off | CPU/req, log on | p99, log off | p99, log on | CPU/req per round (median), log off / on |"
	echo "|---|---:|---:|---:|---:|---:|"
	for t in nginx haproxy naive relay; do
		printf '| %s | %s | %s | %s | %s | %s / %s |\n' "$t" \
			"$(ratio "$(col toron 7)" "$(col "$t" 7)")" "$(ratio "$(col toron-log 7)" "$(col "$t" 7)")" \
			"$(ratio "$(col toron 4)" "$(col "$t" 4)")" "$(ratio "$(col toron-log 4)" "$(col "$t" 4)")" \
			"$(paired toron "$t")" "$(paired toron-log "$t")"
	done
	echo
	printf '| proxy CPU µs/req |'
	for t in "${targets[@]:1}"; do printf ' %s |' "$t"; done
	echo
	printf '|---|'
	for _ in "${targets[@]:1}"; do printf -- '---:|'; done
	echo
	for round in $(seq "$ROUNDS"); do
		printf '| round %s |' "$round"
		for t in "${targets[@]:1}"; do
			printf ' %s |' "$(awk -F'\t' -v r="$round" -v t="$t" 'NR > 1 && $1 == r && $2 == t { print $7 }' "$raw")"
		done
		echo
	done
} >"$vs"

echo
echo "## Peer comparison: medians of $ROUNDS interleaved rounds"
echo
echo "small GET: wrk -t1 -c$CONNECTIONS -d${DURATION}s on core $LOAD_CPU; proxy and upstream on core $PROXY_CPU;"
echo "upload: $UPLOADS concurrent uploads of $UPLOAD_BYTES bytes (Content-Length; 0: not measured); peak RSS over the whole run"
echo "(the direct row's RSS and CPU are the upstream's own RSS, and no proxy CPU)."
echo "machine busy before the run: ${busy}%; load average after: $(cut -d' ' -f1-3 /proc/loadavg);"
echo "other processes on core $PROXY_CPU during the GET runs: at most $(awk -F'\t' 'NR > 1 && $10 + 0 > m { m = $10 + 0 } END { print m + 0 }' "$raw")% of it (see $raw)."
echo
cat "$table"
echo
echo "### Toron's ratios (access log on: level info, JSON to a file, $(wc -l <"$tmp/toron-access.log") lines written)"
echo
cat "$vs"
echo
echo
# The access log's own cost (issue 32: at most 1.05x): Toron with it on against Toron with it off,
# CPU per request, as the median of the per-round ratios and as the ratio of the medians.
echo "access log on / off, Toron's CPU per request: median of the per-round ratios $(paired toron-log toron), ratio of the medians $(ratio "$(col toron-log 7)" "$(col toron 7)")"
echo "per-round values: $raw; tables: $table, $vs"
