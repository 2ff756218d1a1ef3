"""What holds the user's conversations or describes their cache is the owner's alone: the TUI's
history database and the responses store 0600 (in a 0700 folder when we create it), the converted
model's manifest and the aliases file 0600."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest


@pytest.fixture(autouse=True)
def usual_umask():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_the_chat_history_database_is_private(tmp_path):
    from localchat.tui.store import ConversationStore

    path = tmp_path / "data" / "conversations.sqlite3"
    ConversationStore(path).db.close()
    assert _mode(path) == 0o600 and _mode(path.parent) == 0o700
    path.chmod(0o644)  # one written before: narrowed when opened
    ConversationStore(path).db.close()
    assert _mode(path) == 0o600


def test_the_responses_store_is_private(tmp_path):
    from localchat.server.responses.store import SqliteResponseStore

    path = tmp_path / "responses.sqlite3"
    SqliteResponseStore(path)
    assert _mode(path) == 0o600
    assert all(_mode(p) == 0o600 for p in tmp_path.glob("responses.sqlite3*"))


def test_the_converted_manifest_and_the_aliases_are_private(tmp_path, monkeypatch):
    from localchat.engine.loading import model_cache
    from localchat.models import registry

    (tmp_path / "tokenizer.json").write_text("{}")
    model_cache._write_manifest(tmp_path)
    assert _mode(tmp_path / model_cache.MANIFEST) == 0o600
    monkeypatch.setenv("LOCALCHAT_CACHE_DIR", str(tmp_path / "cache"))
    registry._write_aliases({"coder": "/nowhere.gguf"})
    assert registry.read_aliases() == {"coder": "/nowhere.gguf"}
    assert _mode(registry.aliases_file()) == 0o600
    assert _mode(registry.aliases_file().parent) == 0o700
