#!/bin/bash
# S1 paired: for each endpoint, the offline C2 figure just before its server runs (c=1, 8, 32)
set -euo pipefail
cd /work/main
source .venv/bin/activate
OUT=${1:-/tmp/s1/out}
THREADS=${THREADS:-2}
PORT=${PORT:-8765}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
source benchmarks/serve_lib.sh
trap stop_server EXIT
run() { local name=$1; shift; echo "== $name: localchat bench $* ($(date -u +%T), load $(cut -d' ' -f1-3 /proc/loadavg))"; localchat bench "$@" --json "$OUT/$name.json" > "$OUT/$name.txt" 2>&1; tail -25 "$OUT/$name.txt"; }
for endpoint in ${S1_ENDPOINTS:-completions messages responses}; do
  run "c2-before-$endpoint" --workload c2 --threads "$THREADS"
  name=s1; [[ $endpoint == completions ]] || name=s1-$endpoint
  for c in ${LEVELS:-32 8 1}; do
    start_server "$OUT/$name-c$c-serve.log" --threads "$THREADS"
    run "$name-c$c" --workload c2 --url "http://127.0.0.1:$PORT" --endpoint "$endpoint" --concurrency "$c" --baseline "$OUT/c2-before-$endpoint.json"
    stop_server
  done
done
echo done
