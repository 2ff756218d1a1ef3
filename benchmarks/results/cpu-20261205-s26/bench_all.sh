#!/bin/bash
cd /tmp/s26/bench_tree; source /work/main/.venv/bin/activate; export PYTHONPATH=/tmp/s26/bench_tree
git log --oneline -1 > /tmp/s26/res/commit.txt
python -c "from localchat.kernels.cpu_extension import cpu_kernels; cpu_kernels()" 2>&1 | grep -v Warn
echo "== decode A/B" ; python /tmp/s26/decode_ab.py /tmp/c4/llama-8b-q4_0.gguf 2>&1 | grep -v Warn | tee /tmp/s26/res/decode_ab.txt
for i in 1 2; do
  echo "== C4 q4_0 run $i"
  localchat bench --workload c4 --gguf /tmp/c4/llama-8b-q4_0.gguf --threads 2 --compare llama-cpp --json /tmp/s26/res/c4_q4_0_run$i.json > /tmp/s26/res/c4_q4_0_run$i.txt 2>&1
  grep -E "TPOT mean|TTFT mean|vs llama|load|RSS" /tmp/s26/res/c4_q4_0_run$i.txt
done
echo "== GEMV"
for a in "2 Q4_0" "1 Q4_0" "2 Q4_1"; do python /tmp/s26/gemv_ab.py $a 2>&1 | grep -v Warn; done | tee /tmp/s26/res/gemv_ab.txt
echo done > /tmp/s26/res/done
