"""engine/core/memory.py: when the KV pool and packed weights are asked for as huge pages."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from localchat.engine.core import memory


def _virtio_device(root: Path, name: str, device_id: int, features: str) -> None:
    device = root / name
    device.mkdir(parents=True)
    (device / "device").write_text(f"0x{device_id:04x}\n")
    (device / "features").write_text(features + "\n")


@pytest.fixture
def virtio(tmp_path, monkeypatch) -> Path:
    monkeypatch.delenv("LOCALCHAT_HUGE_PAGES", raising=False)
    monkeypatch.setattr(memory, "VIRTIO_DEVICES", tmp_path)
    memory.huge_pages_wanted.cache_clear()
    yield tmp_path
    memory.huge_pages_wanted.cache_clear()


def test_huge_pages_by_default_without_a_reporting_balloon(virtio):
    _virtio_device(virtio, "virtio0", 0x0002, "1" * 64)  # a block device: not a balloon
    _virtio_device(virtio, "virtio1", memory.VIRTIO_ID_BALLOON, "0110000" + "0" * 57)
    assert memory.huge_pages_wanted()


def test_no_huge_pages_where_the_balloon_reports_free_pages(virtio):
    _virtio_device(virtio, "virtio0", memory.VIRTIO_ID_BALLOON, "0110010100" + "0" * 54)
    assert not memory.huge_pages_wanted()


def test_no_virtio_bus_means_huge_pages(virtio, monkeypatch):
    monkeypatch.setattr(memory, "VIRTIO_DEVICES", virtio / "absent")
    assert memory.huge_pages_wanted()


@pytest.mark.parametrize("choice, wanted", [("0", False), ("1", True)])
def test_the_environment_decides(virtio, monkeypatch, choice, wanted):
    _virtio_device(virtio, "virtio0", memory.VIRTIO_ID_BALLOON, "0110010100" + "0" * 54)
    monkeypatch.setenv("LOCALCHAT_HUGE_PAGES", choice)
    assert memory.huge_pages_wanted() is wanted


@pytest.mark.parametrize("choice", ["0", "1"])
def test_resident_zeros_is_zero_either_way(virtio, monkeypatch, choice):
    monkeypatch.setenv("LOCALCHAT_HUGE_PAGES", choice)
    pool = memory.resident_zeros((3, 1 << 20), torch.float32)
    assert pool.shape == (3, 1 << 20) and not pool.any()


def test_freeze_gc_freezes_what_lives_and_frees_what_an_earlier_freeze_held():
    import gc
    import weakref

    class Node:
        pass

    node = Node()
    node.self = node  # a cycle: only the cyclic collector frees it
    alive = weakref.ref(node)
    try:
        memory.freeze_gc()
        assert gc.get_freeze_count() > 0
        del node
        gc.collect()
        assert alive() is not None  # frozen: out of the collector's reach
        memory.freeze_gc()
        assert alive() is None  # unfrozen and collected by the next call
    finally:
        gc.unfreeze()


def test_zero_on_this_thread_clears_what_was_there():
    tensor = torch.full((3, 1000), 7.0)
    assert memory.zero_on_this_thread(tensor)
    assert not tensor.any()
    assert memory.resident_zeros((5, 7), torch.float16, one_thread=True).count_nonzero() == 0


def test_prefaulted_memory_is_taken_once_as_a_zeroed_tensor_of_the_shape():
    prefault = memory.PrefaultedMemory(4096)
    pool = prefault.take((2, 4, 100), torch.float32)  # 3,200 of its 4,096 bytes
    assert pool is not None and pool.shape == (2, 4, 100) and pool.dtype == torch.float32
    assert not pool.any() and pool.untyped_storage().nbytes() == 4096
    assert prefault.take((2, 4, 100), torch.float32) is None  # given away already


def test_prefaulted_memory_too_small_for_the_pool_gives_none():
    assert memory.PrefaultedMemory(1000).take((2, 4, 100), torch.float32) is None


def test_prefaulted_memory_that_cannot_be_had_gives_none_without_a_traceback(monkeypatch):
    failures = []
    monkeypatch.setattr("threading.excepthook", failures.append)
    assert memory.PrefaultedMemory(1 << 62).take((2,), torch.float32) is None
    assert failures == []
