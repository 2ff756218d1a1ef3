"""GEMV A/B in one process, alternating: Q4_0 / Q4_1 (etc.) read in the file's blocks (q4k / q5k, row by
row) against their repacks (u4 / u8, interleaved), copies enough that they stream from DRAM.
argv: threads Q4_K|Q5_K [avx2]."""
import sys, time, statistics
import torch
from gguf import GGMLQuantizationType as T
from localchat.kernels import cpu_extension
if len(sys.argv) > 3:
    cpu_extension._module = cpu_extension.build_kernels(("-mno-avx512f",))
from localchat.engine.gguf_repack import repack, file_blocks_weight
from localchat.kernels.quant_linear import interleave_for_kernel
from tests.cpu.test_gguf_repack import random_blocks
ext = cpu_extension.cpu_kernels()
torch.set_num_threads(int(sys.argv[1]))
qtype = T[sys.argv[2]]
block_bytes = {T.Q4_K: 144, T.Q5_K: 176, T.Q8_0: 272, T.Q4_0: 144, T.Q4_1: 160}[qtype]
def call(x, w):
    return ext.quant_linear(x, w.qweight, w.scales, w.mins, w.super_scales, None, w.bits, w.group_size,
                            w.zero_point, False, False, True, w.arrangement)
for shape in ((4096, 14336), (14336, 4096)):
    file_bytes = shape[0] * shape[1] * block_bytes / 256
    copies = max(2, int(1.2e9 // file_bytes))
    raws = [random_blocks(qtype, *shape, seed=i) for i in range(copies)]
    forms = {"blocks": [file_blocks_weight(torch.from_numpy(r), qtype) for r in raws],
             "repacked": [interleave_for_kernel(repack(r, qtype, shape, None, False)) for r in raws]}
    x = torch.randn(1, shape[1])
    a, b = call(x, forms["blocks"][0]), call(x, forms["repacked"][0])
    print("max rel diff", ((a - b).abs().max() / b.abs().max()).item())
    res = {k: [] for k in forms}
    for rnd in range(12):
        for name, ws in (list(forms.items()) if rnd % 2 else list(forms.items())[::-1]):
            t = time.perf_counter()
            for w in ws: call(x, w)
            res[name].append((time.perf_counter() - t) / copies * 1e3)
    print(ext.simd_isa(), sys.argv[1], "threads", qtype.name, shape, copies, " | ".join(
        f"{k} {statistics.median(v):.3f} ms ({file_bytes / statistics.median(v) / 1e6:.1f} GB/s of the file's bytes)"
        for k, v in res.items()), flush=True)
