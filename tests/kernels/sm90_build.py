"""Compile the kernels for sm_90 (H100/H200) without a GPU, with the launch configs the wrappers use
on CUDA.

The interpreter runs kernels as Python, so it misses errors only the compiler sees (dot shapes and
dtypes, layouts, constexpr misuse). Run as a script with TRITON_INTERPRET unset
(test_triton_kernels.py does); it needs only Triton's bundled ptxas. Exits non-zero on the first
kernel that fails to build.
"""

import os

assert os.environ.get("TRITON_INTERPRET", "0") in ("", "0"), (
    "the interpreter replaces @triton.jit functions"
)

import torch  # noqa: E402
import triton  # noqa: E402
from triton.backends.compiler import GPUTarget  # noqa: E402
from triton.compiler import ASTSource  # noqa: E402

from localchat.kernels import (  # noqa: E402
    triton_activation,
    triton_attention,
    triton_kv_cache,
    triton_moe,
    triton_norm,
    triton_rotary,
)

TARGET = GPUTarget("cuda", 90, 32)
TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


def build(fn, pointers: dict, constexprs: dict, num_warps=4, num_stages=2):
    """Compile fn; unnamed scalar args are i32 (fp32 for scale/eps); pointers and strides
    16-divisible, as the JIT specializes them in practice. Returns the compiled kernel."""
    signature, attrs = {}, {}
    for i, name in enumerate(fn.arg_names):
        if name in constexprs:
            signature[name] = "constexpr"
        elif name in pointers:
            signature[name] = pointers[name]
        else:
            signature[name] = (
                "fp32" if name in ("qk_scale", "softcap", "eps", "limit", "alpha") else "i32"
            )
        if name in pointers or (name.startswith("stride_") and name != "stride_bt"):
            attrs[(i,)] = [["tt.divisibility", 16]]
    options = dict(num_warps=num_warps, num_stages=num_stages)
    return triton.compile(
        ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options
    )


def build_attention(
    dtype: torch.dtype, head_dim: int, group: int, options: bool = False, cache: str | None = None
) -> None:
    """The attention kernels, with every option (window, softcap, sinks) on if `options`, over a
    KV pool of `cache` elements (a Triton type; default: the queries')."""
    t = TYPES[dtype]
    pointers = {name: f"*{t}" for name in ("q_ptr", "k_cache_ptr", "v_cache_ptr", "out_ptr")}
    if cache is not None:
        pointers |= {name: f"*{cache}" for name in ("k_cache_ptr", "v_cache_ptr")}
    pointers |= {
        name: "*i32" for name in ("block_tables_ptr", "seq_lens_ptr", "query_start_loc_ptr")
    }
    pointers |= {
        name: "*fp32" for name in ("part_acc_ptr", "part_m_ptr", "part_l_ptr", "sinks_ptr")
    }
    config = triton_attention._launch_config(dtype, head_dim, on_gpu=True)
    block_n, warps = config["decode"]
    flags = dict(USE_WINDOW=options, SOFTCAP=options, USE_SINKS=options)
    common = dict(HEAD_DIM=head_dim, BLOCK_D=head_dim, BLOCK_N=block_n)
    build(
        triton_attention._decode_kernel,
        pointers,
        dict(
            common,
            NUM_Q_HEADS=8 * group,
            GROUP=group,
            NUM_SPLITS=8,
            BLOCK_SIZE=16,
            BLOCK_G=16,
            DOT_PRECISION=config["precision"],
            **flags,
        ),
        num_warps=warps,
    )
    build(
        triton_attention._decode_reduce_kernel,
        pointers,
        dict(
            common,
            NUM_Q_HEADS=8 * group,
            NUM_SPLITS=8,
            BLOCK_S=8,
            USE_WINDOW=options,
            USE_SINKS=options,
        ),
    )
    block_m, block_n, warps, stages = config["prefill"]
    build(
        triton_attention._prefill_kernel,
        pointers,
        dict(
            GROUP=group,
            HEAD_DIM=head_dim,
            BLOCK_SIZE=16,
            BLOCK_M=block_m,
            BLOCK_Q=block_m // group,
            BLOCK_D=head_dim,
            BLOCK_N=block_n,
            DOT_PRECISION=config["precision"],
            **flags,
        ),
        num_warps=warps,
        num_stages=stages,
    )


def build_store(dtype: torch.dtype, cache: str | None = None) -> None:
    """The KV store from `dtype` keys into a pool of `cache` elements (default: the same)."""
    t = f"*{TYPES[dtype]}"
    c = t if cache is None else f"*{cache}"
    build(
        triton_kv_cache._store_kv_cache_kernel,
        {
            "key_ptr": t,
            "value_ptr": t,
            "k_cache_ptr": c,
            "v_cache_ptr": c,
            "slot_mapping_ptr": "*i64",
        },
        dict(HEAD_DIM=64, NUM_KV_HEADS=3, BLOCK_SIZE=16, BLOCK=256),
    )


def build_pointwise(dtype: torch.dtype) -> None:
    t = f"*{TYPES[dtype]}"
    build_store(dtype)
    for act in triton_activation._ACTIVATIONS.values():
        build(
            triton_activation._act_and_mul_kernel,
            {"x_ptr": t, "y_ptr": t},
            dict(ACT=act, BLOCK=1024),
        )
    build(
        triton_norm._rms_norm_kernel,
        dict.fromkeys(("x_ptr", "weight_ptr", "y_ptr", "residual_ptr", "residual_out_ptr"), t),
        dict(HAS_RESIDUAL=True, BLOCK=1024),
    )
    build(
        triton_rotary._rotary_kernel,
        {
            "q_ptr": t,
            "k_ptr": t,
            "q_out_ptr": t,
            "k_out_ptr": t,
            "cos_ptr": "*fp32",
            "sin_ptr": "*fp32",
        },
        dict(HEAD_DIM=128, HALF=32, BLOCK_HQ=16, BLOCK_HK=4, BLOCK_HALF=32, BLOCK_PASS=64),
    )


SM90_SHARED_MEMORY = 227 * 1024  # the most one block may ask for on an H100/H200


def build_moe(dtype: torch.dtype, every_option: bool) -> None:
    """The fused MoE's kernels with each launch config the wrapper picks (decode to prefill),
    dense with and without biases and K tails, and (if `every_option`) every activation and u8
    and u4 weights; each must fit an SM's shared memory."""
    t = f"*{TYPES[dtype]}"
    index = {name: "*i32" for name in ("sorted_pairs_ptr", "block_experts_ptr")}
    index["num_padded_ptr"] = "*i64"
    dense = dict(w_ptr=t, scales_ptr=t, mins_ptr=t)
    packed = dict(w_ptr="*u8", scales_ptr="*fp16", mins_ptr="*fp16")
    # (weights' pointers, bias and K tail, QUANT, GROUP, HAS_MINS)
    variants = [(dense, False, 0, 1, False), (dense, True, 0, 1, False)]
    if every_option:
        variants += [(packed, True, 1, 16, True), (packed, False, 2, 32, False)]
    for pairs in (8, 2048, 65536):  # 8 pairs over 64 experts (decode), 32 and 1024 per expert
        config = triton_moe._launch_config(pairs, 64, dtype, on_gpu=True)
        common = dict(BLOCK_M=config["block_m"], GROUP_M=8, DOT_PRECISION=config["precision"])
        for name, gated in (("gate_up", True), ("down", False)):
            pointers = dict(x_ptr=t, bias_ptr=t, weights_ptr=t, out_ptr=t if gated else "*fp32")
            block_n, block_k, warps, stages = config[name]
            activations = list(triton_moe._ACTIVATIONS.values())
            for i, (weights, bias, quant, group, mins) in enumerate(variants):
                for act in activations if i == 0 and every_option and gated else [0]:
                    compiled = build(
                        triton_moe._moe_gemm_kernel,
                        dict(index, **pointers, **weights),
                        dict(
                            common,
                            GATED=gated,
                            PAIRS_PER_ROW=8 if gated else 1,
                            ACT=act,
                            QUANT=quant,
                            GROUP=group,
                            HAS_MINS=mins,
                            HAS_BIAS=bias,
                            EVEN_K=not bias,
                            BLOCK_N=block_n,
                            BLOCK_K=block_k,
                        ),
                        num_warps=warps,
                        num_stages=stages,
                    )
                    assert compiled.metadata.shared <= SM90_SHARED_MEMORY, (
                        f"the {name} GEMM asks for {compiled.metadata.shared} B of shared memory"
                    )
    build(
        triton_moe._moe_sum_kernel, {"part_ptr": "*fp32", "out_ptr": t}, dict(TOP_K=8, BLOCK=1024)
    )


if __name__ == "__main__":
    build_moe(torch.bfloat16, every_option=True)
    build_moe(torch.float32, every_option=False)
    build_pointwise(torch.bfloat16)
    build_attention(torch.bfloat16, 128, 4)
    build_attention(torch.float16, 64, 1)
    build_attention(torch.float32, 128, 8)
    build_attention(torch.bfloat16, 64, 8, options=True)  # gpt-oss: window and sinks
    build_attention(torch.float32, 256, 2, options=True)  # Gemma 2: window and softcap
    # --kv-cache-dtype fp8: float8 e4m3 pools under bfloat16 and float16 queries
    build_store(torch.bfloat16, "fp8e4nv")
    build_attention(torch.bfloat16, 128, 4, cache="fp8e4nv")
    build_attention(torch.float16, 64, 8, options=True, cache="fp8e4nv")
    print("built for sm_90")
