"""8B Q4_0 decode, two engines in one process, alternating: Q4_0 read in the file's blocks (q4_0)
against the interleaved u4 repack. argv: gguf path. Prints ms per decode step (median of rounds)."""
import sys, time, statistics
from localchat import LLM, SamplingParams
from localchat.engine import gguf_repack
path = sys.argv[1]
llms = {}
t = time.perf_counter(); llms["blocks"] = LLM(path, max_model_len=512); print(f"blocks load {time.perf_counter() - t:.1f} s", flush=True)
saved = dict(gguf_repack.FILE_BLOCK_TYPES)
for q in (gguf_repack.T.Q4_0, gguf_repack.T.Q4_1):
    gguf_repack.FILE_BLOCK_TYPES.pop(q)
t = time.perf_counter(); llms["repacked"] = LLM(path, max_model_len=512); print(f"repacked load {time.perf_counter() - t:.1f} s", flush=True)
gguf_repack.FILE_BLOCK_TYPES.update(saved)
m = lambda l: l.engine.runner.model
print({k: m(l).layers[0].self_attn.o_weight.layout for k, l in llms.items()})
n = 48
params = SamplingParams(temperature=0, max_tokens=n, ignore_eos=True)
res = {k: [] for k in llms}; outs = {}
for rnd in range(6):
    for name, llm in (list(llms.items()) if rnd % 2 else list(llms.items())[::-1]):
        out = llm.generate([list(range(100, 116))], params)[0]
        tt = out.metrics.token_times if hasattr(out, "metrics") and out.metrics and hasattr(out.metrics, "token_times") else None
        t = time.perf_counter()
        out = llm.generate([list(range(200, 216))], params)[0].outputs[0]
        res[name].append((time.perf_counter() - t) / n * 1e3); outs[name] = out.token_ids
print("same tokens:", outs["blocks"] == outs["repacked"])
for k, v in res.items():
    print(k, f"median {statistics.median(v):.1f} ms/token", [round(x, 1) for x in v], flush=True)
