"""GEMV from cache (one small weight, called repeatedly): blocks vs repacked interleaved, compute-bound."""
import sys, time, statistics
import torch
from gguf import GGMLQuantizationType as T
from localchat.kernels import cpu_extension
from localchat.engine.gguf_repack import repack, file_blocks_weight
from localchat.kernels.quant_linear import interleave_for_kernel
from tests.cpu.test_gguf_repack import random_blocks
ext = cpu_extension.cpu_kernels()
torch.set_num_threads(int(sys.argv[1]))
qtype = T[sys.argv[2]]
def call(x, w):
    return ext.quant_linear(x, w.qweight, w.scales, w.mins, w.super_scales, None, w.bits, w.group_size,
                            w.zero_point, False, False, True, w.arrangement)
for shape in ((1024, 4096), (256, 14336)):
    r = random_blocks(qtype, *shape, seed=1)
    forms = {"blocks": file_blocks_weight(torch.from_numpy(r), qtype),
             "repacked": interleave_for_kernel(repack(r, qtype, shape, None, False))}
    x = torch.randn(1, shape[1])
    res = {k: [] for k in forms}
    for rnd in range(10):
        for name, w in forms.items():
            t = time.perf_counter()
            for _ in range(200): call(x, w)
            res[name].append((time.perf_counter() - t) / 200 * 1e6)
    print(qtype.name, shape, " | ".join(f"{k} {min(v):.1f} us" for k, v in res.items()), flush=True)
