"""The access log writes a request's path and method with control characters escaped: a path
cannot forge a log line or send terminal escapes."""

from __future__ import annotations

import logging

from localchat.server.access_log import access_log


async def _app(scope, receive, send):
    await send({"type": "http.response.start", "status": 404, "headers": []})
    await send({"type": "http.response.body", "body": b""})


async def _sent(message):
    pass


async def test_a_path_cannot_forge_a_log_line(caplog):
    path = '/v1/x\r\n127.0.0.1 "GET /admin" 200 0.001s\x1b[2J\x9b31m\\"'
    scope = {"type": "http", "method": "GET\n", "path": path, "client": ("1.2.3.4", 5)}
    with caplog.at_level(logging.INFO, logger="localchat.server"):
        await access_log(_app)(scope, None, _sent)
    (line,) = [r.getMessage() for r in caplog.records]
    assert "\n" not in line and "\r" not in line and "\x1b" not in line and "\x9b" not in line
    assert line.startswith('1.2.3.4 "GET\\x0a /v1/x\\x0d\\x0a127.0.0.1 \\x22GET /admin\\x22 200')
    assert line.endswith('\\x1b[2J\\x9b31m\\\\\\x22" 404 ' + line.rsplit(" ", 1)[-1])


def test_escape_keeps_printable_text():
    from localchat.server.access_log import escape

    assert escape("/v1/chat/completions?a=é") == "/v1/chat/completions?a=é"
