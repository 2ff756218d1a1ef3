"""Refuse a JSON request body that nests deeper than the json_depth bound (request_limits.py)
before anything decodes it: a body of 50,000 `[` would otherwise run the decoder into its recursion
limit, and every handler walks what it decodes.

A body with fewer brackets than the bound cannot nest past it, so most bodies cost two
bytes.count() calls. Others are measured in a few numpy passes over their bytes: quotes not escaped
by an odd run of backslashes open and close strings, and the brackets outside strings give the
depth as a running sum.
"""

from __future__ import annotations

import asyncio

import numpy as np

from localchat.engine.sampling.request_limits import limits
from localchat.server.request_guard import (
    BODY_METHODS,
    ASGIApp,
    BodyTooLarge,
    ClientGone,
    Receive,
    Scope,
    Send,
    read_body,
    replay,
    send_error,
    send_too_large,
)

_QUOTE, _BACKSLASH = ord('"'), ord("\\")
_STEP = np.zeros(256, np.int8)  # what each byte adds to the depth outside strings
_STEP[[ord("{"), ord("[")]] = 1
_STEP[[ord("}"), ord("]")]] = -1
_IN_THREAD = 64 << 10  # a body this large is measured off the event loop


def nests_deeper(body: bytes, most: int) -> bool:
    """Whether the JSON text `body` nests objects and arrays more than `most` deep (brackets inside
    strings do not count; a body that is not JSON gets an answer all the same, and the decoder's
    error after)."""
    if body.count(b"{") + body.count(b"[") <= most:
        return False
    data = np.frombuffer(body, np.uint8)
    quotes = data == _QUOTE
    if quotes.any():
        slashes = data == _BACKSLASH
        if slashes.any():
            # a quote after an odd run of backslashes is escaped: the run ends at the quote's left
            positions = np.arange(len(data), dtype=np.int32)
            last_other = np.maximum.accumulate(np.where(slashes, np.int32(-1), positions))
            run = np.zeros(len(data), np.int32)
            run[1:] = positions[:-1] - last_other[:-1]
            quotes &= run % 2 == 0
        # from an opening quote up to (not including) its closing one, the count of quotes is odd
        inside = np.logical_xor.accumulate(quotes)
        steps = np.where(inside, np.int8(0), _STEP[data])
    else:
        steps = _STEP[data]
    return int(np.cumsum(steps, dtype=np.int32).max()) > most


def limit_json_depth(app: ASGIApp) -> ASGIApp:
    """ASGI middleware (a Litestar middleware factory): a POST, PUT or PATCH body nesting deeper
    than limits().json_depth is a 400 in the API's error shape; other bodies go on as sent."""

    async def middleware(scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or scope.get("method") not in BODY_METHODS:
            return await app(scope, receive, send)
        try:
            body = await read_body(scope, receive)
        except BodyTooLarge:
            return await send_too_large(scope, send)
        except ClientGone:
            return None
        most = limits().json_depth
        deeper = (
            await asyncio.to_thread(nests_deeper, body, most)
            if len(body) >= _IN_THREAD
            else nests_deeper(body, most)
        )
        if deeper:
            message = (
                f"the request body nests deeper than {most} levels (the server's --limit "
                "json_depth)"
            )
            return await send_error(scope, send, message, 400, "invalid_request_error")
        return await app(scope, replay(body, receive), send)

    return middleware
