"""triton_quant_linear against PackedWeight.dequantize(), on the CPU interpreter (float32, float16)
or, with LOCALCHAT_KERNEL_DEVICE=cuda, on a GPU (bfloat16 as well).

Shapes are small (the interpreter runs every program in Python) but cross the interpreter's tiles:
16 rows, 32 columns, 64 weights of K per step, and two K splits when M <= 16.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from localchat.kernels import triton_quant_linear as tql
from localchat.kernels.packed_weight import PackedWeight, pack_u4, quantize_weight
from localchat.kernels.triton_quant_linear import triton_quant_linear
from tests.kernels.conftest import (
    DEVICE,  # imports the Triton kernels interpreted, on the CPU
)

ON_GPU = DEVICE != "cpu"
DTYPES = [torch.float32, torch.float16] + ([torch.bfloat16] if ON_GPU else [])
cpu_only = pytest.mark.skipif(
    ON_GPU, reason="checks the interpreter's launch config and the sm_90 build"
)


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


def reference(x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None) -> torch.Tensor:
    y = x.float() @ weight.dequantize().T
    return y if bias is None else y + bias.float()


def check(x: torch.Tensor, weight: PackedWeight, bias: torch.Tensor | None = None) -> None:
    out = triton_quant_linear(x, weight, bias)
    assert out.dtype == x.dtype and out.shape == (*x.shape[:-1], weight.shape[0])
    expected = reference(x, weight, bias)
    # The error is relative to the size of the sums, not of each output (some cancel to near zero).
    scale = (x.float().abs() @ weight.dequantize().abs().T).amax().item()
    rel = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 1e-2}[x.dtype]
    if ON_GPU and x.dtype == torch.float32:
        rel = 1e-4  # 3xTF32 dots
    torch.testing.assert_close(out.float(), expected, atol=rel * scale, rtol=0)


def symmetric_u8(n: int, k: int, group: int, zero_point: int) -> PackedWeight:
    """A symmetric u8 weight built by hand, like Q6_K (group 16, zero point 32) or Q8_0 (group 32,
    128)."""
    codes = torch.randint(0, 2 * zero_point, (n, k), dtype=torch.uint8)
    scales = (torch.rand(n, k // group) * 0.02 + 0.001).to(torch.float16)
    return PackedWeight("u8", codes, scales, None, group, zero_point=zero_point, source_type="Q6_K")


def symmetric_u4(n: int, k: int) -> PackedWeight:
    """A symmetric u4 weight (Q4_0: zero point 8), packed by hand."""
    codes = torch.randint(0, 16, (n, k), dtype=torch.uint8)
    scales = (torch.rand(n, k // 32) * 0.05 + 0.001).to(torch.float16)
    return PackedWeight("u4", pack_u4(codes), scales, None, 32, zero_point=8, source_type="Q4_0")


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 17, 64])
@pytest.mark.parametrize("bits", [4, 8])
def test_asymmetric(dtype, m, bits):
    # N and K are not multiples of the tiles (32 columns, 64 weights): masked edges on both.
    n, k = 40, 160
    weight = quantize_weight(torch.randn(n, k), bits)
    x = torch.randn(m, k).to(dtype)
    check(x, weight, torch.randn(n).to(dtype))


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 17])
def test_symmetric_u4(dtype, m):
    weight = symmetric_u4(48, 96)
    check(torch.randn(m, 96).to(dtype), weight)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("m", [1, 3, 17, 64])
def test_symmetric_u8_group16(dtype, m):
    weight = symmetric_u8(72, 80, group=16, zero_point=32)
    check(torch.randn(m, 80).to(dtype), weight, torch.randn(72, dtype=torch.float32))


@pytest.mark.parametrize("dtype", DTYPES)
def test_asymmetric_u8_group16(dtype):
    weight = quantize_weight(torch.randn(33, 48), 8, group_size=16)
    check(torch.randn(5, 48).to(dtype), weight)


def test_symmetric_u8_group32():
    check(torch.randn(3, 96), symmetric_u8(24, 96, group=32, zero_point=128))


def test_nibble_order():
    # One non-zero code at each position of the first group: weight j sits in byte j's low nibble,
    # weight j + 16 in its high nibble. x = identity picks the weight's columns back out, exactly.
    k = 64
    codes = torch.zeros(k, k, dtype=torch.uint8)
    codes[torch.arange(k), torch.arange(k)] = torch.arange(k, dtype=torch.uint8) % 15 + 1
    ones = torch.ones(k, k // 32, dtype=torch.float16)
    weight = PackedWeight("u4", pack_u4(codes), ones, torch.zeros_like(ones), 32)
    out = triton_quant_linear(torch.eye(k), weight)
    torch.testing.assert_close(out, codes.T.float(), atol=0, rtol=0)


def test_leading_dims_strides_and_empty():
    weight = quantize_weight(torch.randn(40, 64), 4)
    x = torch.randn(2, 3, 128)[..., ::2]  # non-contiguous last dim
    out = triton_quant_linear(x, weight)
    assert out.shape == (2, 3, 40)
    torch.testing.assert_close(
        out.reshape(6, 40), reference(x.reshape(6, 64), weight, None), atol=1e-4, rtol=1e-4
    )
    assert triton_quant_linear(torch.randn(0, 64), weight).shape == (0, 40)


def test_bad_input():
    weight = quantize_weight(torch.randn(40, 64), 8)
    with pytest.raises(ValueError, match="features"):
        triton_quant_linear(torch.randn(2, 32), weight)
    with pytest.raises(ValueError, match="float16"):
        triton_quant_linear(torch.randn(2, 64).to(torch.float64), weight)
    with pytest.raises(ValueError, match="bias"):
        triton_quant_linear(torch.randn(2, 64), weight, torch.randn(41))


@cpu_only
def test_interpreter_config_splits_k():
    # The decode path is tested with split-K and the reduce kernel; larger M with one split.
    device = torch.device("cpu")
    assert tql._launch_config(1, 40, 160, True, torch.float32, device)["splits"] == 2
    assert tql._launch_config(64, 40, 160, False, torch.float32, device)["splits"] == 1


@cpu_only
@pytest.mark.parametrize("u4", [True, False])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_gpu_launch_configs(monkeypatch, u4, dtype):
    # An H200's 132 SMs: decode splits K to fill them, prefill does not; no split is empty, and a K
    # step covers whole 32-groups.
    monkeypatch.setattr(tql, "_num_sms", lambda index: 132)
    cuda = torch.device("cuda", 0)
    for m in (1, 16, 17, 64, 512, 4096):
        for n, k in ((4096, 4096), (14336, 4096), (4096, 14336), (1024, 8192)):
            c = tql._launch_config(m, n, k, u4, dtype, cuda)
            k_blocks = -(-k // c["block_k"])
            assert c["block_k"] % 32 == 0 and (c["splits"] - 1) * c["blocks_per_split"] < k_blocks
            assert c["splits"] * c["blocks_per_split"] >= k_blocks
            # a tile for every SM already (a narrow N still splits its long K)
            if m >= 512 and n >= 4096:
                assert c["splits"] == 1
    assert tql._launch_config(1, 4096, 4096, u4, dtype, cuda)["splits"] > 1


SM90_BUILD = r"""
import re, subprocess, tempfile
from pathlib import Path
import torch, triton
from triton.backends.nvidia.compiler import get_ptxas
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource
from localchat.kernels import triton_quant_linear as tql

def build(fn, pointers, constexprs, num_warps=4, num_stages=2):
    signature = {name: "constexpr" if name in constexprs else pointers.get(name, "i32")
                 for name in fn.arg_names}
    # Pointers and the weight/scale row strides are 16-divisible in practice; the JIT specializes
    # them so.
    attrs = {(i,): [["tt.divisibility", 16]] for i, name in enumerate(fn.arg_names)
             if name in pointers or name in ("stride_xm", "stride_qn", "stride_om", "K")}
    kernel = triton.compile(ASTSource(fn, signature, constexprs, attrs),
                            target=GPUTarget("cuda", 90, 32),
                            options=dict(num_warps=num_warps, num_stages=num_stages))
    return kernel

def spills(kernel):
    # ptxas -v on the kernel's PTX: "N bytes spill stores" (no GPU driver needed).
    with tempfile.TemporaryDirectory() as tmp:
        ptx = Path(tmp) / "k.ptx"
        ptx.write_text(kernel.asm["ptx"])
        command = [get_ptxas(90).path, "-v", "-arch=sm_90a", str(ptx), "-o", str(Path(tmp) / "k.o")]
        info = subprocess.run(command, capture_output=True, text=True, check=True).stderr
    regs = re.search(r"Used (\d+) registers", info).group(1)
    return int(re.search(r"(\d+) bytes spill stores", info).group(1)), int(regs)

for dtype, t in ((torch.bfloat16, "bf16"), (torch.float32, "fp32")):  # float16 builds like bfloat16
    for m in (1, 32, 512):
        for u4, group, has_mins in (
            (True, 32, True), (True, 32, False), (False, 16, False), (False, 32, True)
        ):
            block_m, block_n, block_k, warps, stages = tql._tiles(m, True, u4, dtype)
            pointers = {"x_ptr": f"*{t}", "q_ptr": "*u8", "scales_ptr": "*fp16",
                        "mins_ptr": "*fp16", "bias_ptr": f"*{t}",
                        "out_ptr": "*fp32" if m == 1 else f"*{t}"}
            kernel = build(tql._quant_linear_kernel, pointers, dict(
                U4=u4, GROUP=group, HAS_MINS=has_mins, HAS_BIAS=m != 1, PARTIAL=m == 1,
                BLOCK_M=block_m, BLOCK_N=block_n, BLOCK_K=block_k, GROUP_M=8,
                DOT_PRECISION="tf32x3" if t == "fp32" else "tf32"),
                num_warps=warps, num_stages=stages)
            spilled, regs = spills(kernel)
            print(t, m, "u4" if u4 else "u8", group, has_mins,
                  "spill bytes", spilled, "registers", regs)
            assert spilled == 0, f"{t} m={m} u4={u4} group={group} spills {spilled} bytes"
build(tql._reduce_splits_kernel, {"part_ptr": "*fp32", "bias_ptr": "*bf16", "out_ptr": "*bf16"},
      dict(SPLITS=8, HAS_BIAS=True, BLOCK=1024))
print("built for sm_90")
"""


@cpu_only
def test_kernel_builds_for_sm90():
    # The interpreter never compiles; build the GPU launch configs for an H100/H200 in a process
    # without it.
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    root = Path(__file__).parents[2]
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(root), env.get("PYTHONPATH")]))
    result = subprocess.run(
        [sys.executable, "-c", SM90_BUILD],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-4000:]
