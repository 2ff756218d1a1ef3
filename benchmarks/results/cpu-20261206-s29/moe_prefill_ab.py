import os, sys, time, random
os.environ.setdefault("LOCALCHAT_CACHE_DIR", "/tmp/c5/cache")
from localchat import LLM, SamplingParams
from localchat.engine.models.moe import SparseMoE
llm = LLM(sys.argv[1], max_model_len=512, kv_cache_memory="256MiB")
moes = [m for m in llm.engine.runner.model.modules() if isinstance(m, SparseMoE)]
built = [m.cpu_experts() for m in moes]
def run(seed, grouped):
    for m, b in zip(moes, built):
        m._cpu_experts = b if grouped else False
    r = random.Random(seed)
    toks = [r.randrange(1000, 40000) for _ in range(128)]
    t = time.perf_counter()
    llm.generate([toks], SamplingParams(temperature=0, max_tokens=1, ignore_eos=True))
    return time.perf_counter() - t
print("warm", round(run(0, True), 2), round(run(1, False), 2), flush=True)
res = {True: [], False: []}
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 3):
    for g in ((True, False) if i % 2 == 0 else (False, True)):
        res[g].append(run(100 + 2 * i + g, g))
        print("grouped" if g else "loop   ", round(res[g][-1], 3), flush=True)
import statistics
print("median grouped", round(statistics.median(res[True]), 3), "loop", round(statistics.median(res[False]), 3))
