"""Stored responses, for `previous_response_id` and `GET /v1/responses/{id}`: bounded by count and
by bytes, the least recently used going first; in memory by default, in SQLite with
`--responses-store PATH` (kept across restarts).

A record is one response's JSON: the response object, its input items, and the items of its
whole conversation (its history: what a request continuing it follows), so that evicting a
response never breaks one that continues it. Records are JSON bytes here; their size is what the
byte bound counts. Calls are thread-safe (the routes make them off the event loop)."""

from __future__ import annotations

import sqlite3
import threading
from collections import OrderedDict
from pathlib import Path
from typing import Any, Protocol

import msgspec

from localchat.utils import private_file

MAX_RESPONSES = 10_000
MAX_BYTES = 256 * 2**20

_encode, _decode = msgspec.json.Encoder().encode, msgspec.json.Decoder().decode


class ResponseStore(Protocol):
    def put(self, response_id: str, record: dict[str, Any]) -> None:
        """Keep the record (one larger than the whole store is not kept)."""

    def get(self, response_id: str) -> dict[str, Any] | None:
        """The record, now the most recently used; None when unknown or evicted."""

    def delete(self, response_id: str) -> bool: ...


class MemoryResponseStore:
    def __init__(self, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES):
        self.max_responses, self.max_bytes = max_responses, max_bytes
        self._records: OrderedDict[str, bytes] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def put(self, response_id: str, record: dict[str, Any]) -> None:
        data = _encode(record)
        with self._lock:
            self._drop(response_id)
            if len(data) > self.max_bytes:  # never kept, and no reason to evict the others
                return
            self._records[response_id] = data
            self._bytes += len(data)
            while len(self._records) > self.max_responses or self._bytes > self.max_bytes:
                self._drop(next(iter(self._records)))

    def get(self, response_id: str) -> dict[str, Any] | None:
        with self._lock:
            data = self._records.get(response_id)
            if data is None:
                return None
            self._records.move_to_end(response_id)
        return _decode(data)

    def delete(self, response_id: str) -> bool:
        with self._lock:
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        data = self._records.pop(response_id, None)
        if data is not None:
            self._bytes -= len(data)
        return data is not None


class SqliteResponseStore:
    """The same bounds in a SQLite file; `used` orders the records by their last use."""

    def __init__(
        self, path: str | Path, max_responses: int = MAX_RESPONSES, max_bytes: int = MAX_BYTES
    ):
        self.max_responses, self.max_bytes = max_responses, max_bytes
        try:  # clients' conversations: the owner's alone (0600)
            private_file(Path(path), make_dir=False)
        except OSError as exc:  # as sqlite3 would fail (a missing folder is not made)
            raise sqlite3.OperationalError(f"unable to open database file: {exc}") from None
        self._db = sqlite3.connect(str(path), check_same_thread=False)
        self._db.execute("PRAGMA journal_mode=WAL")
        self._db.execute(
            "CREATE TABLE IF NOT EXISTS responses "
            "(id TEXT PRIMARY KEY, record BLOB NOT NULL, size INTEGER NOT NULL, used INTEGER)"
        )
        self._db.execute("CREATE INDEX IF NOT EXISTS responses_used ON responses (used)")
        self._db.commit()
        count, size, used = self._db.execute(
            "SELECT COUNT(*), COALESCE(SUM(size), 0), COALESCE(MAX(used), 0) FROM responses"
        ).fetchone()
        self._count, self._bytes, self._clock = count, size, used
        self._lock = threading.Lock()

    def put(self, response_id: str, record: dict[str, Any]) -> None:
        data = _encode(record)
        with self._lock, self._db:
            self._drop(response_id)
            if len(data) > self.max_bytes:
                return
            self._clock += 1
            self._db.execute(
                "INSERT INTO responses VALUES (?, ?, ?, ?)",
                (response_id, data, len(data), self._clock),
            )
            self._count, self._bytes = self._count + 1, self._bytes + len(data)
            while self._count > self.max_responses or self._bytes > self.max_bytes:
                (oldest,) = self._db.execute(
                    "SELECT id FROM responses ORDER BY used LIMIT 1"
                ).fetchone()
                self._drop(oldest)

    def get(self, response_id: str) -> dict[str, Any] | None:
        with self._lock:
            row = self._db.execute(
                "SELECT record FROM responses WHERE id = ?", (response_id,)
            ).fetchone()
            if row is None:
                return None
            self._clock += 1
            with self._db:
                self._db.execute(
                    "UPDATE responses SET used = ? WHERE id = ?", (self._clock, response_id)
                )
        return _decode(row[0])

    def delete(self, response_id: str) -> bool:
        with self._lock, self._db:
            return self._drop(response_id)

    def _drop(self, response_id: str) -> bool:
        row = self._db.execute("SELECT size FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None:
            return False
        self._db.execute("DELETE FROM responses WHERE id = ?", (response_id,))
        self._count, self._bytes = self._count - 1, self._bytes - row[0]
        return True

    def close(self) -> None:
        self._db.close()


def open_store(path: str | Path | None) -> ResponseStore:
    """The SQLite store at `path`, or a store in memory."""
    return MemoryResponseStore() if path is None else SqliteResponseStore(path)
