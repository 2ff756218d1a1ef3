# Throwaway A/B harness of the twenty-second session, kept as run last (default model: 200 steps, 256 MiB pool;
# the 8B rows of kv_dtype_ab.txt used 12 steps, times[2:], and 1 GiB): python kv_dtype_ab.py MODEL.gguf 64,512,2048
"""A/B of the KV pool dtype on the 8B decode step, in one process: the whole model forward for one
decode token at context L, with the pool reallocated in each dtype, alternating."""
import sys, time, statistics, torch
from localchat import LLM, SamplingParams
from localchat.engine.sequence import Request

path = sys.argv[1]
contexts = [int(c) for c in sys.argv[2].split(",")]
llm = LLM(path, max_model_len=4096, kv_cache_memory="256MiB", enable_prefix_caching=False, kv_cache_dtype="float16")
runner = llm.engine.runner
num_blocks = llm.engine.block_manager.num_blocks
results = {}
for rnd in range(3):
    for dtype in (torch.float16, torch.float32):
        runner.kv_cache_dtype = dtype
        runner._bind_kv_cache(None)
        blocks = min(num_blocks, (1 << 30) // runner.bytes_per_block())
        runner.allocate_kv_cache(blocks)
        for L in contexts:
            seq = Request("x", [1] * L, SamplingParams(max_tokens=1)).seqs[0]
            seq.block_table = list(range(-(-L // 16)))
            seq.num_computed_tokens = L - 1
            ids, pos, md, _ = runner._prepare([seq], [1])
            times = []
            with torch.inference_mode():
                for i in range(200):
                    t = time.perf_counter()
                    runner._forward(ids, pos, md)
                    times.append(time.perf_counter() - t)
            results.setdefault((str(dtype), L), []).append(statistics.median(times[20:]) * 1000)
            print(rnd, dtype, L, f"{statistics.median(times[20:])*1000:.1f} ms", flush=True)
for k, v in sorted(results.items()):
    print(k, [f"{x:.1f}" for x in v])
