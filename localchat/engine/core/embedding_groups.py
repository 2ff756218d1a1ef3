"""EmbeddingGroups: the embedding requests one call queued in an engine's scheduler, gathered back
into that call's matrix of vectors as they finish (AsyncEngine and the data-parallel replicas)."""

from __future__ import annotations

from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Generic, TypeVar

import numpy as np

from localchat.engine.core.llm_engine import LLMEngine
from localchat.engine.core.sequence import Request
from localchat.errors import InvalidParameterError, LocalchatError

Key = TypeVar("Key", bound=Hashable)


def invalid_input(exc: Exception) -> InvalidParameterError:
    """The 400 for input the engine could not take."""
    return InvalidParameterError(f"invalid input: {exc}", param="input")


@dataclass
class _Group(Generic[Key]):
    key: Key
    request_ids: list[str]
    left: int
    rows: np.ndarray | None = field(default=None)  # [prompts, hidden] float32, from the first


class EmbeddingGroups(Generic[Key]):
    """Calls (each known by a key) whose prompts wait in the scheduler as embedding requests."""

    def __init__(self) -> None:
        self._slots: dict[str, tuple[_Group[Key], int]] = {}

    def __bool__(self) -> bool:
        return bool(self._slots)

    def add(
        self,
        engine: LLMEngine,
        key: Key,
        request_ids: list[str],
        prompts: list[list[int]],
        pooling: str,
    ) -> LocalchatError | None:
        """Queue one call's prompts (LLMEngine.add_embeddings); the error for its caller, if any."""
        try:
            engine.add_embeddings(request_ids, prompts, pooling)
        except LocalchatError as exc:
            return exc
        except Exception as exc:  # bad input must not take the engine down
            return invalid_input(exc)
        group = _Group(key, list(request_ids), len(prompts))
        for index, request_id in enumerate(request_ids):
            self._slots[request_id] = (group, index)
        return None

    def discard(self, request_id: str) -> None:
        """Forget an aborted request."""
        self._slots.pop(request_id, None)

    def fail(self, request_ids: list[str]) -> tuple[list[Key], set[str]]:
        """Forget the calls any of `request_ids` belongs to (a failed step ran them): their keys,
        and the ids of all their requests not yet finished (the others are to be aborted)."""
        keys: list[Key] = []
        members: set[str] = set()
        for request_id in request_ids:
            slot = self._slots.get(request_id)
            if slot is None:
                continue
            group = slot[0]
            keys.append(group.key)
            members.update(m for m in group.request_ids if self._slots.pop(m, None) is not None)
        return keys, members

    def collect(self, finished: list[Request]) -> list[tuple[Key, np.ndarray]]:
        """The calls whose every vector is now in, from the requests `take_embedded()` returned."""
        done = []
        for request in finished:
            slot = self._slots.pop(request.request_id, None)
            if slot is None or request.embedding is None:  # aborted meanwhile
                continue
            group, index = slot
            vector = request.embedding.numpy()
            if group.rows is None:
                group.rows = np.empty((len(group.request_ids), vector.shape[0]), np.float32)
            group.rows[index] = vector
            group.left -= 1
            if group.left == 0:
                done.append((group.key, group.rows))
        return done

    def drain(self) -> list[Key]:
        """The keys of every call still waiting, forgotten (the engine is going away)."""
        keys = list({id(group): group.key for group, _ in self._slots.values()}.values())
        self._slots.clear()
        return keys
