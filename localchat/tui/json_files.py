"""Reading a JSON file the user named (a /json schema, an --mcp servers file): every way it can fail
is an InvalidParameterError in one line, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localchat.errors import InvalidParameterError


def read_json_file(path: Path, prefix: str, param: str) -> Any:
    """The parsed contents of `path`; a missing, unreadable or malformed file raises an
    InvalidParameterError saying `PREFIX: ...` and why."""
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise InvalidParameterError(f"{prefix}: there is no file {path}", param=param) from None
    except IsADirectoryError:
        raise InvalidParameterError(f"{prefix}: {path} is a directory", param=param) from None
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) else "not UTF-8 text"
        raise InvalidParameterError(
            f"{prefix}: cannot read {path}: {reason}", param=param
        ) from None
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise InvalidParameterError(
            f"{prefix}: {path} is not JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
            param=param,
        ) from None
