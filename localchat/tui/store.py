"""SQLite persistence of conversations, written after every message so a crash loses nothing."""

from __future__ import annotations

import json
import logging
import sqlite3
import time
from pathlib import Path

from localchat import envs
from localchat.errors import InvalidParameterError
from localchat.tui.conversation import Conversation, StoredMessage
from localchat.tui.json_mode import JsonMode
from localchat.utils import private_file

logger = logging.getLogger("localchat.tui")

_SCHEMA = """
CREATE TABLE IF NOT EXISTS conversations (
    id INTEGER PRIMARY KEY AUTOINCREMENT,
    title TEXT NOT NULL,
    system_prompt TEXT,
    settings TEXT NOT NULL,
    think INTEGER,
    created REAL NOT NULL,
    updated REAL NOT NULL,
    json_mode TEXT
);
CREATE TABLE IF NOT EXISTS messages (
    conversation_id INTEGER NOT NULL REFERENCES conversations(id) ON DELETE CASCADE,
    position INTEGER NOT NULL,
    role TEXT NOT NULL,
    content TEXT NOT NULL,
    thinking TEXT NOT NULL DEFAULT '',
    stopped INTEGER NOT NULL DEFAULT 0,
    meta TEXT NOT NULL DEFAULT '{}',
    PRIMARY KEY (conversation_id, position)
);
"""

# Columns added to `conversations` since its first release, each with its type: a database written
# before gets them (NULL in its rows) when it is opened.
_ADDED_COLUMNS = {"json_mode": "TEXT"}


def data_dir() -> Path:
    """Where localchat keeps its data: $LOCALCHAT_DATA_DIR, else the platform's user data
    directory."""
    override = envs.DATA_DIR.get()
    if override:
        return Path(override)
    import platformdirs

    return Path(platformdirs.user_data_dir("localchat"))


def default_db_path() -> Path:
    return data_dir() / "conversations.sqlite3"


class ConversationStore:
    """Conversations and their messages in one SQLite file (`path=None`: in memory, kept
    nothing)."""

    def __init__(self, path: str | Path | None = None):
        if path is not None:  # the user's conversations: 0600, in a 0700 folder we create
            private_file(Path(path))
        self.path = path
        self.db = sqlite3.connect(":memory:" if path is None else str(path))
        self.db.execute("PRAGMA foreign_keys = ON")
        self.db.executescript(_SCHEMA)
        self._add_columns()
        self.db.commit()

    def _add_columns(self) -> None:
        """Bring a database from before a column was added up to date (nothing else changes)."""
        have = {row[1] for row in self.db.execute("PRAGMA table_info(conversations)")}
        with self.db:
            for name, kind in _ADDED_COLUMNS.items():
                if name not in have:
                    self.db.execute(f"ALTER TABLE conversations ADD COLUMN {name} {kind}")

    def close(self) -> None:
        self.db.close()

    # --- conversations ----------------------------------------------------------------------------
    def save_conversation(self, conversation: Conversation) -> int:
        """Insert (giving it an id) or update the conversation's title, system prompt, settings and
        /json mode."""
        now = time.time()
        think = None if conversation.think is None else int(conversation.think)
        settings = json.dumps(conversation.settings)
        mode = conversation.json_mode
        json_mode = None if mode is None else json.dumps(mode.to_dict())
        fields = (conversation.title, conversation.system_prompt, settings, think, json_mode, now)
        with self.db:
            if conversation.id is None:
                cursor = self.db.execute(
                    "INSERT INTO conversations"
                    " (title, system_prompt, settings, think, json_mode, updated, created)"
                    " VALUES (?, ?, ?, ?, ?, ?, ?)",
                    (*fields, now),
                )
                conversation.id = cursor.lastrowid
            else:
                self.db.execute(
                    "UPDATE conversations"
                    " SET title=?, system_prompt=?, settings=?, think=?, json_mode=?, updated=?"
                    " WHERE id=?",
                    (*fields, conversation.id),
                )
        assert conversation.id is not None  # the row the INSERT made, or the one updated
        return conversation.id

    def load(self, conversation_id: int) -> Conversation | None:
        row = self.db.execute(
            "SELECT id, title, system_prompt, settings, think, json_mode FROM conversations"
            " WHERE id=?",
            (conversation_id,),
        ).fetchone()
        if row is None:
            return None
        messages = [
            StoredMessage(role, content, thinking, bool(stopped), json.loads(meta))
            for role, content, thinking, stopped, meta in self.db.execute(
                "SELECT role, content, thinking, stopped, meta FROM messages"
                " WHERE conversation_id=? ORDER BY position",
                (conversation_id,),
            )
        ]
        think = None if row[4] is None else bool(row[4])
        return Conversation(
            row[0], row[1], messages, row[2], json.loads(row[3]), think, _json_mode(row[0], row[5])
        )

    def list_conversations(self) -> list[tuple[int, str]]:
        """(id, title) of every conversation, most recently updated first."""
        return self.db.execute(
            "SELECT id, title FROM conversations ORDER BY updated DESC, id DESC"
        ).fetchall()

    def last_id(self) -> int | None:
        row = self.db.execute(
            "SELECT id FROM conversations ORDER BY updated DESC, id DESC LIMIT 1"
        ).fetchone()
        return row[0] if row else None

    def rename(self, conversation_id: int, title: str) -> None:
        with self.db:
            self.db.execute("UPDATE conversations SET title=? WHERE id=?", (title, conversation_id))

    def delete(self, conversation_id: int) -> None:
        with self.db:
            self.db.execute("DELETE FROM conversations WHERE id=?", (conversation_id,))

    # --- messages ---------------------------------------------------------------------------------
    def save_message(self, conversation: Conversation, position: int) -> None:
        """Write messages[position] (insert or replace), creating the conversation row if needed."""
        if conversation.id is None:
            self.save_conversation(conversation)
        message = conversation.messages[position]
        with self.db:
            self.db.execute(
                "INSERT OR REPLACE INTO messages"
                " (conversation_id, position, role, content, thinking, stopped, meta)"
                " VALUES (?, ?, ?, ?, ?, ?, ?)",
                (
                    conversation.id,
                    position,
                    message.role,
                    message.content,
                    message.thinking,
                    int(message.stopped),
                    json.dumps(message.meta),
                ),
            )
            self.db.execute(
                "UPDATE conversations SET updated=? WHERE id=?", (time.time(), conversation.id)
            )

    def truncate(self, conversation: Conversation, length: int) -> None:
        """Forget the messages from `length` on (the conversation object is trimmed by the
        caller)."""
        if conversation.id is not None:
            with self.db:
                self.db.execute(
                    "DELETE FROM messages WHERE conversation_id=? AND position>=?",
                    (conversation.id, length),
                )


def _json_mode(conversation_id: int, stored: str | None) -> JsonMode | None:
    """The /json mode a conversation was saved with (None: off). One this version cannot follow
    any more is left off, with a warning in the log (its row keeps it until the conversation is
    saved again)."""
    if stored is None:
        return None
    try:
        return JsonMode.from_dict(json.loads(stored))
    except (InvalidParameterError, ValueError, KeyError, TypeError) as exc:
        logger.warning("conversation %s: its /json mode is left off: %s", conversation_id, exc)
        return None
