"""The C++ block cache under torch's CPU allocator (kernels/csrc/block_cache.h): freed tensors of
1 MiB and more are kept for reuse up to a limit, the least recently freed dropped first."""

from __future__ import annotations

import torch

MIB = 1 << 20


def _block(mib: int) -> torch.Tensor:
    return torch.empty(mib * MIB, dtype=torch.uint8)


def test_a_freed_large_block_is_reused_and_the_limit_holds(ext):
    ext.install_block_cache(64 * MIB)
    ext.install_block_cache(0)  # empty it: earlier tests' blocks
    ext.install_block_cache(9 * MIB)
    cached, blocks, hits = ext.block_cache_stats()
    assert (cached, blocks) == (0, 0)
    first = _block(4)
    address = first.data_ptr()
    del first
    assert ext.block_cache_stats()[:2] == (4 * MIB, 1)
    again = _block(4)  # the same size class: the same memory, counted as a hit
    assert again.data_ptr() == address
    assert ext.block_cache_stats() == (0, 0, hits + 1)
    again.fill_(7)
    assert int(again[-1]) == 7

    small = torch.empty(1000)  # below 1 MiB: the heap's, never cached
    del small
    assert ext.block_cache_stats()[:2] == (0, 0)

    a, b, c = _block(4), _block(4), _block(4)
    oldest = a.data_ptr()
    del a, b  # 8 MiB cached
    del c  # 12 MiB would pass the limit: the least recently freed (a's) goes
    assert ext.block_cache_stats()[:2] == (8 * MIB, 2)
    kept = [_block(4), _block(4)]
    assert oldest not in {t.data_ptr() for t in kept}
    del kept
    too_big = _block(16)  # larger than the whole limit: given back at once
    del too_big
    assert ext.block_cache_stats()[:2] == (8 * MIB, 2)


def test_a_request_takes_a_cached_block_only_when_little_of_it_is_wasted(ext):
    ext.install_block_cache(0)
    ext.install_block_cache(64 * MIB)
    big = _block(8)
    address = big.data_ptr()
    del big
    small = _block(2)  # 8 MiB for 2 would waste three quarters: a new block
    assert small.data_ptr() != address
    close = _block(7)  # within a quarter: the cached 8 MiB block
    assert close.data_ptr() == address
    del small, close


def test_the_engine_keeps_large_cpu_blocks_unless_told_not_to(ext, monkeypatch):
    from localchat.engine.core.memory import cache_cpu_blocks

    monkeypatch.setenv("LOCALCHAT_CPU_BLOCK_CACHE_MB", "0")
    assert not cache_cpu_blocks(64 * MIB)
    monkeypatch.delenv("LOCALCHAT_CPU_BLOCK_CACHE_MB")
    ext.install_block_cache(0)
    assert cache_cpu_blocks(MIB // 4)  # 16 x 1/4 MiB: the floor, 32 MiB
    blocks = [_block(4) for _ in range(10)]
    del blocks
    assert ext.block_cache_stats()[:2] == (32 * MIB, 8)
