# Shared by run_cpu.sh and run_gpu.sh (source it): start and stop a `localchat serve` for S1 runs.
# Each concurrency level gets a fresh server, so no run finds its prompts in a cache an earlier run filled.

healthy() { python -c "import httpx, sys; sys.exit(httpx.get(sys.argv[1]).status_code != 200)" "$1" 2>/dev/null; }

start_server() {  # start_server LOG ARGS...: sets SERVER (pid) and waits until /health answers 200
  local log=$1; shift
  localchat serve --port "$PORT" --log-level warning "$@" >"$log" 2>&1 &
  SERVER=$!
  for _ in $(seq 1200); do
    healthy "http://127.0.0.1:$PORT/health" && return 0
    kill -0 "$SERVER" 2>/dev/null || { cat "$log"; return 1; }
    sleep 0.5
  done
  echo "server did not become healthy"; return 1
}

stop_server() {
  [[ -n "${SERVER:-}" ]] || return 0
  kill -TERM "$SERVER" 2>/dev/null || true
  wait "$SERVER" 2>/dev/null || true
  SERVER=
}
