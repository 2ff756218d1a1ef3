"""Moved to localchat/models/source.py (models/ sits below the engine). This name stays only for
the callers not yet moved (engine/distributed/torchrun.py, bench/runner.py, tui/engine_backend.py);
it looks each name up in models.source when asked, so a monkeypatched `resolve_model` there is the
one it gives."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from localchat.models import source

if TYPE_CHECKING:
    from localchat.models.source import ModelSource, resolve_model

__all__ = ["ModelSource", "resolve_model"]


def __getattr__(name: str) -> Any:
    return getattr(source, name)
