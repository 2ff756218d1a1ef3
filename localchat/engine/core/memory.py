"""Keep the process heap from growing under the varied tensor shapes of continuous batching (glibc).

glibc's malloc raises its mmap threshold to the size of the largest mmapped block freed so far (up
to 32 MiB). After the first steps, a step's large tensors (a prefill chunk's activations, the logits
of many rows) are carved from the heap instead, and the ever-changing shapes of a serving load leave
holes in it that are never given back: a server's RSS grew from 1.05 to 2.6 GB in 8 minutes under 64
clients. A fixed threshold of 1 MiB sends those tensors to mmap, returned to the system when freed;
smaller ones, all of batch-1 decode included, stay on the heap and cost nothing more. On a CPU,
`cache_cpu_blocks` then keeps those large blocks for reuse up to a bounded total.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import functools
import gc
import logging
import math
import os
import threading
from pathlib import Path

import torch

from localchat import envs

logger = logging.getLogger("localchat.engine")


def freeze_gc() -> None:
    """Collect garbage, then put every object alive now out of the cyclic collector's reach
    (gc.freeze), as a server does once it is loaded. A process holding torch, transformers and a
    model tracks ~370k objects; a full collection walks them all while holding the GIL, 146 ms
    measured here, which stalls the engine thread and the event loop alike (a streamed reply of 256
    tokens took one). Frozen, the same collection took 12 ms. Objects frozen by an earlier call are
    unfrozen first, so the cycles of an engine that was let go are collected now."""
    gc.unfreeze()
    gc.collect()
    gc.freeze()


def _load_libc() -> ctypes.CDLL | None:
    try:
        return ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
    except OSError:
        return None


_LIBC = _load_libc()


M_MMAP_THRESHOLD = -3  # mallopt parameter (malloc.h)
MMAP_THRESHOLD_BYTES = 1 << 20
_applied = False


def fix_mmap_threshold() -> bool:
    """Set glibc's mmap threshold once per process; False where that is not possible (another C
    library) or the user chose it already with MALLOC_MMAP_THRESHOLD_."""
    global _applied
    if _applied or "MALLOC_MMAP_THRESHOLD_" in os.environ:
        return _applied
    mallopt = getattr(_LIBC, "mallopt", None)
    if mallopt is None:  # not glibc (macOS, Windows)
        return False
    _applied = bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD_BYTES))
    if _applied:
        logger.debug("malloc: tensors of %d bytes and more are mmapped", MMAP_THRESHOLD_BYTES)
    return _applied


CPU_BLOCK_CACHE_MAX = 512 << 20
CPU_BLOCK_CACHE_MIN = 32 << 20
CPU_BLOCK_CACHE_ACTIVATIONS = 16  # times a step's largest activation: about two layers' temporaries


def cache_cpu_blocks(activation_bytes: int) -> bool:
    """Keep freed CPU tensors of 1 MiB and more for reuse, through the C++ kernels' block cache
    (kernels/csrc/block_cache.h). A prefill makes the same large temporaries at every layer; mapped
    afresh each time (see fix_mmap_threshold), they faulted their pages in again and again: an 8B
    model's 128-token prefill took 3.6-5 s warm and 7 s for the first prompt, against 2.7-3.7 s
    with the memory kept. The cache holds 16 times `activation_bytes` (a step's largest
    activation: the MLP's at the largest batch), between 32 and 512 MiB, so a small model's server
    grows by little; LOCALCHAT_CPU_BLOCK_CACHE_MB sets it (0: off). False where the kernels are
    not built here or the cache is off."""
    from localchat.kernels.cpu_extension import cpu_kernels

    limit = min(
        max(CPU_BLOCK_CACHE_ACTIVATIONS * activation_bytes, CPU_BLOCK_CACHE_MIN),
        CPU_BLOCK_CACHE_MAX,
    )
    chosen = envs.CPU_BLOCK_CACHE_MB.get()
    if chosen is not None:
        limit = chosen << 20
    ext = cpu_kernels()
    if ext is None or limit <= 0:
        return False
    ext.install_block_cache(limit)
    return True


MADV_HUGEPAGE = 14  # madvise advice (linux/mman.h)
HUGE_PAGE = 1 << 21


# virtio's balloon device id and its feature bit (linux/virtio_ids.h, linux/virtio_balloon.h)
VIRTIO_ID_BALLOON = 0x0005
VIRTIO_BALLOON_F_REPORTING = 5
VIRTIO_DEVICES = Path("/sys/bus/virtio/devices")


@functools.cache
def huge_pages_wanted() -> bool:
    """Whether the KV pool and the packed weights are asked for as transparent huge pages.

    LOCALCHAT_HUGE_PAGES=1 or 0 decides; by default yes, except in a VM whose memory balloon takes
    back the guest's free memory (free page reporting, in 2 MiB blocks). There every huge page is
    such a block, given back and faulted in again from the host a 4 KiB page at a time: measured
    on a Firecracker VM, 2 GiB zeroed in 4-11 s as huge pages against 0.4-1.9 s in 4 KiB pages, and
    an 8B model loaded in 26-28 s against 15-16 s. Elsewhere huge pages load faster (11-12 s -> 6-9
    s on another VM) and decode reads its weights through fewer TLB entries."""
    choice = envs.HUGE_PAGES.get()
    if choice is not None:
        return choice
    return not _balloon_reports_free_pages()


def _balloon_reports_free_pages() -> bool:
    try:
        devices = list(VIRTIO_DEVICES.iterdir())
    except OSError:  # not Linux, or no virtio bus
        return False
    for device in devices:
        try:
            if int((device / "device").read_text(), 16) != VIRTIO_ID_BALLOON:
                continue
            features = (device / "features").read_text().strip()
        except (OSError, ValueError):
            continue
        if features[VIRTIO_BALLOON_F_REPORTING : VIRTIO_BALLOON_F_REPORTING + 1] == "1":
            return True
    return False


def resident_zeros(shape: tuple[int, ...], dtype, *, one_thread: bool = False) -> torch.Tensor:
    """A zeroed CPU tensor whose pages are all resident from the start, asked for as transparent
    huge pages where the system allows them (Linux THP in `madvise` mode) and `huge_pages_wanted`.
    Zeroing 1 GiB in 4 KiB pages took 0.2-1.8 s on one VM, one page fault each; in 2 MiB pages
    about 0.05 s, and the KV pool's reads then miss the TLB less. `one_thread` zeroes it with
    memset on the calling thread instead of torch's thread pool (for a background thread)."""
    tensor = torch.empty(shape, dtype=dtype)
    if huge_pages_wanted():
        _advise_huge_pages(tensor)
    if one_thread and zero_on_this_thread(tensor):
        return tensor
    return tensor.zero_()


def zero_on_this_thread(tensor: torch.Tensor) -> bool:
    """Zero a contiguous CPU tensor with libc's memset on the calling thread; False (untouched)
    where there is no C library to call."""
    nbytes = tensor.numel() * tensor.element_size()
    if _LIBC is None or not tensor.is_contiguous():
        return False
    if nbytes:
        _LIBC.memset(ctypes.c_void_p(tensor.data_ptr()), 0, ctypes.c_size_t(nbytes))
    return True


def _advise_huge_pages(tensor: torch.Tensor) -> None:
    start = -(-tensor.data_ptr() // HUGE_PAGE) * HUGE_PAGE
    end = (tensor.data_ptr() + tensor.numel() * tensor.element_size()) // HUGE_PAGE * HUGE_PAGE
    if end > start and _LIBC is not None:
        with contextlib.suppress(AttributeError):  # not glibc: plain pages
            _LIBC.madvise(ctypes.c_void_p(start), ctypes.c_size_t(end - start), MADV_HUGEPAGE)


class PrefaultedMemory:
    """`nbytes` of zeroed, resident CPU memory made on a background thread while the model loads,
    for the KV pool. Its page faults cost 0.5-1.6 s a GiB on a ballooned VM; made after the weights
    they added that to every load, made beside the config's import (one core, Python) they cost
    nothing. memset releases the GIL and uses no thread pool, so the loading thread runs on."""

    def __init__(self, nbytes: int):
        self.nbytes = nbytes
        self._memory: torch.Tensor | None = None
        self._thread = threading.Thread(target=self._fill, name="kv-prefault", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            self._memory = resident_zeros((self.nbytes,), torch.uint8, one_thread=True)
        except (RuntimeError, MemoryError):  # the pool's own allocation then says so
            self._memory = None

    def take(self, shape: tuple[int, ...], dtype: torch.dtype) -> torch.Tensor | None:
        """The memory as a zeroed tensor of `shape` and `dtype` (waiting for it if need be), once;
        None where it is too small."""
        self._thread.join()
        memory, self._memory = self._memory, None
        nbytes = math.prod(shape) * torch.empty(0, dtype=dtype).element_size()
        if memory is None or nbytes > memory.numel():
            return None
        return memory[:nbytes].view(dtype).view(shape)
