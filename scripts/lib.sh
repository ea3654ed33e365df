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
		for _ in $(seq 50); do
			kill -0 "$pid" 2>/dev/null || break
			sleep 0.1
		done
		kill -KILL "$pid" 2>/dev/null || true
		wait "$pid" 2>/dev/null || true
	done
	rm -rf "$tmp"
}
trap cleanup EXIT
trap 'exit 130' INT TERM

# port_free PORT: true when nothing listens on 127.0.0.1:PORT.
port_free() { ! (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

bench_name=${bench_name:-$(basename "$0" .sh)}

# wait_http URL NAME: wait up to 10 s for an HTTP answer.
wait_http() {
	for _ in $(seq 100); do
		if curl -s -o /dev/null --max-time 1 "$1"; then return 0; fi
		sleep 0.1
	done
	echo "$bench_name: $2 did not answer $1 within 10 s" >&2
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
