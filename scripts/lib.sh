# Shared by the bench scripts (sourced, not run): a temporary folder, the processes the script
# started (append their pids to `pids`), and a cleanup on exit that stops every one of them.
# The caller sets `tmp_prefix` before sourcing.

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
