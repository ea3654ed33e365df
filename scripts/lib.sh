# Shared by the bench scripts (sourced, not run): a temporary folder, the processes the script
# started (append their pids to `pids`), a cleanup on exit that stops every one of them, and
# the helpers below (waiting for a server, CPU time of a process tree, filling a template).
# The caller sets `tmp_prefix` before sourcing; messages start with `bench_name` (default: the
# script's file name without .sh).

tmp=$(mktemp -d "/tmp/${tmp_prefix:-toron-bench}.XXXXXX")
chmod 755 "$tmp"
pids=()

cleanup() {
	local pid
	for pid in "${pids[@]}"; do
		kill -TERM "$pid" 2>/dev/null || true
	done
	for pid in "${pids[@]}"; do
		reap "$pid"
	done
	rm -rf "$tmp"
}

# reap PID: wait up to 5 s for a process told to stop, then kill it, and collect its exit.
reap() {
	for _ in $(seq 50); do
		kill -0 "$1" 2>/dev/null || break
		sleep 0.1
	done
	kill -KILL "$1" 2>/dev/null || true
	wait "$1" 2>/dev/null || true
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# port_free PORT: true when nothing listens on 127.0.0.1:PORT.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

bench_name=${bench_name:-$(basename "$0" .sh)}

# ports_free PORT...: exit 1, naming the port, when something listens on one of them.
ports_free() {
	local p
	for p in "$@"; do
		port_free "$p" || { echo "$bench_name: port $p is in use; set BASE_PORT" >&2; exit 1; }
	done
}

# need_ints NAME...: exit 2 unless each named variable holds only digits (as the script's
# settings must), naming them all in the message.
need_ints() {
	local v names
	for v in "$@"; do
		case ${!v} in
		*[!0-9]*)
			if [ $# -eq 1 ]; then
				echo "$bench_name: $1 must be an integer" >&2
				exit 2
			fi
			names=$(printf '%s, ' "$@")
			names=${names%, }
			echo "$bench_name: ${names%, *} and ${names##*, } must be integers" >&2
			exit 2
			;;
		esac
	done
}

# need_rounds_duration: exit 2 unless ROUNDS is 1..9 and DURATION 1..300 (seconds).
need_rounds_duration() {
	if [ "$ROUNDS" -lt 1 ] || [ "$ROUNDS" -gt 9 ] || [ "$DURATION" -lt 1 ] || [ "$DURATION" -gt 300 ]; then
		echo "$bench_name: ROUNDS must be 1..9 and DURATION 1..300 seconds" >&2
		exit 2
	fi
}

# spawn OUT CMD...: CMD in the background, its stdout and stderr into the file OUT; its pid is
# appended to pids and left in `spawned`.
spawn() {
	local out=$1
	shift
	"$@" >"$out" 2>&1 &
	spawned=$!
	pids+=("$spawned")
}

# spawn_toron OUT CONFIG ROUTES: spawn bin/toron on core PROXY_CPU with the CONFIG and ROUTES
# files, the caller's TORON_CONFIG and TORON_ROUTES left out of its environment.
spawn_toron() {
	spawn "$1" env -u TORON_CONFIG -u TORON_ROUTES taskset -c "$PROXY_CPU" bin/toron -config "$2" -routes "$3"
}

# spawn_nginx OUT PREFIX [BINARY]: spawn nginx (default: the one on PATH) on core PROXY_CPU in
# the foreground, from the prefix folder PREFIX and its PREFIX/nginx.conf.
spawn_nginx() {
	spawn "$1" taskset -c "$PROXY_CPU" "${3:-nginx}" -p "$2" -c "$2/nginx.conf" -e "$2/error.log"
}

# build_bins: bin/toron (make build) and the loadtest binary, whose path goes into LT.
build_bins() {
	echo "$bench_name: building bin/toron and the loadtest binary"
	make -s build >/dev/null
	go build -o "$tmp/loadtest" ./loadtest
	LT=$tmp/loadtest
}

# wait_http URL NAME [CURL ARGS...]: wait up to 10 s for an HTTP answer; the curl arguments are
# for an HTTPS URL (--cacert FILE, or -k).
wait_http() {
	local url=$1 name=$2
	shift 2
	for _ in $(seq 100); do
		if curl -s -o /dev/null --max-time 1 "$@" "$url"; then return 0; fi
		sleep 0.1
	done
	echo "$bench_name: $name did not answer $url within 10 s" >&2
	return 1
}

# children PID: its direct children, from /proc (no procps needed).
children() {
	local f st
	for f in /proc/[0-9]*/stat; do
		{ read -r -a st <"$f"; } 2>/dev/null || continue
		[ "${st[3]}" = "$1" ] && echo "${st[0]}"
	done
	return 0
}

# proc_tree PID: the pid and its direct children.
proc_tree() { echo "$1"; children "$1"; }

# cpu_ticks PID...: summed utime+stime in clock ticks.
cpu_ticks() {
	local sum=0 pid f
	for pid in "$@"; do
		[ -r "/proc/$pid/stat" ] || continue
		# The fields after the command name (which may contain spaces) start at field 3, the
		# state: utime (field 14) and stime (field 15) are the 12th and 13th of them.
		read -r -a f <<<"$(sed 's/^.*) //' "/proc/$pid/stat")"
		sum=$((sum + f[11] + f[12]))
	done
	echo "$sum"
}

# fill TEMPLATE OUT [SED ARGS...]: the template with @PORT@, @UPSTREAM@ (127.0.0.1:$UP_PORT)
# and @PREFIX@ filled in from the caller's PORT, UP_PORT and PREFIX, and whatever more
# substitutions the caller passes.
fill() {
	local in=$1 out=$2
	shift 2
	sed -e "s|@PORT@|$PORT|g" -e "s|@UPSTREAM@|127.0.0.1:$UP_PORT|g" -e "s|@PREFIX@|$PREFIX|g" "$@" "$in" >"$out"
}

# wrk_counts OUTPUT: "req/s requests errors" of one wrk run's output; errors are the non-2xx or
# 3xx responses and the socket errors.
wrk_counts() {
	local rps reqs errs
	rps=$(awk '/^Requests\/sec:/ {print $2}' <<<"$1")
	reqs=$(awk '/requests in/ {print $1}' <<<"$1")
	errs=$(awk '/Non-2xx or 3xx responses:/ {n += $NF} /Socket errors:/ {gsub(",", ""); n += $4 + $6 + $8 + $10} END {print n + 0}' <<<"$1")
	echo "${rps:-0} ${reqs:-0} $errs"
}

# median: the median of the numbers on stdin, one a line ("-" when there are none).
median() { sort -g | awk '{ v[NR] = $1 } END { if (NR == 0) { print "-"; exit } if (NR % 2) print v[(NR + 1) / 2]; else printf "%.3f\n", (v[NR / 2] + v[NR / 2 + 1]) / 2 }'; }

# ratio A B: A / B to two decimals, "-" when either is missing or B is 0.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (b + 0 == 0 || a == "-" || b == "-") print "-"; else printf "%.2f", a / b }'; }
