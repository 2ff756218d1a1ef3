#!/usr/bin/env bash
# Reproduce the CPU tables of docs/benchmarks.md: C1, C2, C3 (vs HF transformers and llama.cpp) and S1
# (`localchat serve` + `localchat bench --url` vs the offline C2 figure). Run on a quiet machine.
#
#   benchmarks/run_cpu.sh [OUT_DIR]        (default: benchmarks/results/cpu-<date>)
#
# Every run writes a --json file (figures, machine, versions, exact command) into OUT_DIR; the tables
# print to the terminal and to OUT_DIR/*.txt. Set PEERS=hf to skip llama.cpp (needs llama-cpp-python:
# pip install 'localchat[llama-cpp]'); set THREADS to pin torch/llama.cpp threads (default 2, as DESIGN.md).
# S1_ENDPOINTS picks S1's endpoints (default "completions messages responses").
# EXTRA adds flags to every bench (a quick smoke run: EXTRA="--input-len 16:32 --output-len 20").
set -euo pipefail

OUT=${1:-benchmarks/results/cpu-$(date -u +%Y%m%d-%H%M%S)}
THREADS=${THREADS:-2}
PORT=${PORT:-8765}
if [[ -z "${PEERS:-}" ]]; then
  if python -c "import llama_cpp" 2>/dev/null; then PEERS=hf,llama-cpp; else PEERS=hf; fi
fi
mkdir -p "$OUT"
export HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false

# shellcheck source=benchmarks/serve_lib.sh
source "$(dirname "$0")/serve_lib.sh"
trap stop_server EXIT

run() {  # run NAME ARGS...: one bench, its table kept next to its JSON
  local name=$1; shift
  echo "== $name: localchat bench $*"
  # shellcheck disable=SC2086
  localchat bench "$@" ${EXTRA:-} --json "$OUT/$name.json" | tee "$OUT/$name.txt"
}

localchat pull >/dev/null
run c1 --workload c1 --threads "$THREADS" --compare "$PEERS"
run c2 --workload c2 --threads "$THREADS" --compare "$PEERS"
run c3 --workload c3 --threads "$THREADS" --compare "$PEERS"

# S1: the same C2 mix through the server, at concurrency 1, 8 and 32, against the offline C2 figure
# (a fresh server for each level), through each endpoint of S1_ENDPOINTS (default: all three;
# messages and responses send the prompts as text, see docs/benchmarks.md).
for endpoint in ${S1_ENDPOINTS:-completions messages responses}; do
  name=s1; [[ $endpoint == completions ]] || name=s1-$endpoint
  for c in 1 8 32; do
    start_server "$OUT/$name-c$c-serve.log" --threads "$THREADS"
    run "$name-c$c" --workload c2 --url "http://127.0.0.1:$PORT" --endpoint "$endpoint" \
      --concurrency "$c" --baseline "$OUT/c2.json"
    stop_server
  done
done
echo "results in $OUT"
