#!/usr/bin/env bash
# C2 through `localchat serve` at concurrency 32 (as S1 does): DP=1 x 2 threads against DP=2 x 1 thread,
# a fresh server per run, alternated A B A B. Usage: benchmarks/results/dp-20261202/run.sh [OUT]
set -euo pipefail
OUT=${1:-benchmarks/results/dp-20261202}
PORT=${PORT:-8765}
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH}  # this checkout's code, whatever the venv installed
source benchmarks/serve_lib.sh
trap stop_server EXIT
for round in 1 2; do
  for config in "dp1x2:-dp 1 --threads 2" "dp2x1:-dp 2 --threads 1"; do
    name=${config%%:*}-$round
    ! healthy "http://127.0.0.1:$PORT/health" || { echo "port $PORT is already served"; exit 1; }
    start_server "$OUT/$name-serve.log" ${config#*:}
    localchat bench --workload c2 --url "http://127.0.0.1:$PORT" --concurrency 32 \
      --json "$OUT/$name.json" | tee "$OUT/$name.txt"
    stop_server
  done
done
