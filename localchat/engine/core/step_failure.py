"""When an engine step fails: which failures end only that step's requests (the engine serves on),
and the error those requests end with.

A forward that raises (out of memory on a large prefill or prompt-logprobs chunk, a kernel's
error) leaves the engine's state as it was before the step: the step's sequences are ended, their
blocks freed, and the blocks the step would have filled taken out of the prefix cache
(BlockManager.forget_unwritten). Three kinds of failure cannot be recovered that way and still
end the engine: a dead engine (EngineDeadError), any failure under tensor parallelism (the other
ranks may be inside a collective that rank 0 left, so the group is out of step), and a CUDA error
other than out of memory (the device's context is lost: every later call fails).
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from localchat.errors import EngineDeadError, EngineStepError

MESSAGE_CHARS = 200  # of the exception's first line, in the client's error


def recoverable(exc: BaseException, tensor_parallel: bool) -> bool:
    """Whether the engine may go on after a step raised `exc`, once the step's requests end."""
    if tensor_parallel or isinstance(exc, EngineDeadError) or not isinstance(exc, Exception):
        return False
    if isinstance(exc, torch.cuda.OutOfMemoryError):  # torch.OutOfMemoryError
        return True
    accelerator_error = getattr(torch, "AcceleratorError", None)  # torch >= 2.8
    if accelerator_error is not None and isinstance(exc, accelerator_error):
        return False
    return not (isinstance(exc, RuntimeError) and "CUDA error" in str(exc))


def step_error(exc: BaseException, request_ids: Iterable[str]) -> EngineStepError:
    """The error a failed step's requests end with (a 500 in the API's shape)."""
    lines = str(exc).strip().splitlines()
    detail = lines[0][:MESSAGE_CHARS] if lines else ""
    why = f"{type(exc).__name__}: {detail}" if detail else type(exc).__name__
    return EngineStepError(
        f"the engine step that ran this request failed ({why}); the engine serves on",
        tuple(request_ids),
    )
