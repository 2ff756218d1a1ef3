"""keep_alive as ollama reads it: how long a model stays loaded after its last request. A number is
seconds, a string a Go-style duration ('5m', '1h30m', '90s', '500ms') or a number; 0 unloads the
model as soon as it is idle, a negative value keeps it loaded for good (None here)."""

from __future__ import annotations

import re

from localchat.errors import InvalidParameterError

_UNITS = {"ns": 1e-9, "us": 1e-6, "µs": 1e-6, "ms": 1e-3, "s": 1.0, "m": 60.0, "h": 3600.0}
_PART = re.compile(r"(\d+(?:\.\d*)?|\.\d+)(ns|us|µs|ms|s|m|h)")
_NUMBER = re.compile(r"[+-]?(\d+(\.\d*)?|\.\d+)")


def parse_keep_alive(value: object, *, param: str = "keep_alive") -> float | None:
    """Seconds to stay loaded once idle, or None for forever; anything else is a named 400."""
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise _bad(value, param)
    if isinstance(value, str):
        text = value.strip()
        if _NUMBER.fullmatch(text):
            seconds = float(text)
        else:
            sign = -1.0 if text.startswith("-") else 1.0
            body = text.lstrip("+-")
            parts = _PART.findall(body)
            if not body or "".join(n + u for n, u in parts) != body:
                raise _bad(value, param)
            seconds = sign * sum(float(n) * _UNITS[u] for n, u in parts)
    else:
        seconds = float(value)
    if seconds != seconds or seconds in (float("inf"), float("-inf")):  # NaN, inf
        raise _bad(value, param)
    return None if seconds < 0 else seconds


def _bad(value: object, param: str) -> InvalidParameterError:
    return InvalidParameterError(
        f"{param}={value!r} is not a duration; use seconds (300), a duration ('5m', '1h30m', "
        "'90s'), 0 to unload at once or -1 to stay loaded",
        param=param,
    )


def format_duration(seconds: float | None) -> str:
    """'forever', '45s', '4m 10s', '2h 5m'."""
    if seconds is None:
        return "forever"
    whole = max(0, round(seconds))
    hours, rest = divmod(whole, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h {minutes}m" if minutes else f"{hours}h"
    if minutes:
        return f"{minutes}m {secs}s" if secs else f"{minutes}m"
    return f"{secs}s"
