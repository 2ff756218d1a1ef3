"""One MoE layer of the C5 file, 128 tokens routed uniformly (as a trained router spreads them):
the grouped C++ call against the experts one by one, alternating."""
import os, sys, time, statistics
os.environ.setdefault("LOCALCHAT_CACHE_DIR", "/tmp/c5/cache")
import torch
from localchat import LLM
from localchat.engine.models.moe import SparseMoE
llm = LLM(sys.argv[1], max_model_len=512, kv_cache_memory="256MiB")
moe = next(m for m in llm.engine.runner.model.modules() if isinstance(m, SparseMoE))
grouped = moe.cpu_experts()
g = torch.Generator().manual_seed(0)
T, E, k = 128, moe.moe.num_experts, moe.moe.top_k
hidden = torch.randn(T, moe.router_weight.shape[1], generator=g)
ids = torch.stack([torch.randperm(E, generator=g)[:k] for _ in range(T)])
weights = torch.softmax(torch.randn(T, k, generator=g), -1)
print("experts used", int((torch.bincount(ids.flatten(), minlength=E) > 0).sum()), "max rows", int(torch.bincount(ids.flatten()).max()))
def once(use):
    moe._cpu_experts = grouped if use else False
    t = time.perf_counter(); out = moe._experts_in_turn(hidden, weights, ids); return time.perf_counter() - t, out
for use in (True, False): once(use)  # page the experts in
res = {True: [], False: []}
for i in range(int(sys.argv[2]) if len(sys.argv) > 2 else 8):
    for use in ((True, False) if i % 2 == 0 else (False, True)):
        res[use].append(once(use)[0] * 1000)
a, b = once(True)[1], once(False)[1]
print("max abs diff", float((a - b).abs().max()), "scale", float(b.abs().max()))
print("grouped ms", [round(x, 1) for x in res[True]])
print("one by one ms", [round(x, 1) for x in res[False]])
print("median grouped", round(statistics.median(res[True]), 1), "one by one", round(statistics.median(res[False]), 1))
