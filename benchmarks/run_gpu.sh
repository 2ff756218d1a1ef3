#!/usr/bin/env bash
# G1 (offline throughput) and G2 (batch-1 decode) of DESIGN.md on one CUDA GPU, vs HF transformers,
# and S1 at concurrency 1, 8, 32 on the G1 mix. Qwen3-0.6B config with dummy weights, bf16.
#
#   benchmarks/run_gpu.sh [OUT_DIR]      (MODEL=path/to/qwen3-0.6b to override)
set -euo pipefail

OUT=${1:-benchmarks/results/gpu-$(date -u +%Y%m%d-%H%M%S)}
MODEL=${MODEL:-../shared/models/qwen3-0.6b}
PORT=${PORT:-8766}
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1

# shellcheck source=benchmarks/serve_lib.sh
source "$(dirname "$0")/serve_lib.sh"
trap stop_server EXIT

run() {
  local name=$1; shift
  echo "== $name: localchat bench $*"
  localchat bench "$@" --json "$OUT/$name.json" | tee "$OUT/$name.txt"
}

run g1 "$MODEL" --workload g1 --compare hf
run g2 "$MODEL" --workload g2 --compare hf

for c in 1 8 32; do
  start_server "$OUT/s1-c$c-serve.log" "$MODEL" --load-format dummy --dtype bfloat16
  run "s1-c$c" "$MODEL" --workload g1 --url "http://127.0.0.1:$PORT" --concurrency "$c" --baseline "$OUT/g1.json"
  stop_server
done
echo "results in $OUT"
