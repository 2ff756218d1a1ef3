"""uvicorn as `serve` runs it (uvicorn_run.uvicorn_server) bounds what one client holds: a request
head that trickles in is cut at --header-timeout, a body at --body-timeout (408), a body over the
limit is a 413 before it is read, connections beyond --max-connections get 503 (a trivial app,
no model)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import subprocess
import sys

import pytest

from localchat import envs
from localchat.server.uvicorn_run import ConnectionLimits, uvicorn_server


async def _app(scope, receive, send):
    if scope["type"] != "http":
        return
    body = b""
    while True:
        message = await receive()
        body += message.get("body", b"")
        if not message.get("more_body"):
            break
    if scope["path"] == "/slow":
        await asyncio.sleep(2)
    reply = str(len(body)).encode()
    headers = [(b"content-type", b"text/plain"), (b"content-length", str(len(reply)).encode())]
    await send({"type": "http.response.start", "status": 200, "headers": headers})
    await send({"type": "http.response.body", "body": reply})


@contextlib.asynccontextmanager
async def _serving(limits: ConnectionLimits):
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn_server(_app, log_level="warning", grace_period=0, limits=limits)
    server.install_signal_handlers = lambda: None  # type: ignore[method-assign]
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started:
        await asyncio.sleep(0.01)
    try:
        yield sock.getsockname()[1]
    finally:
        server.should_exit = True
        await task


async def _exchange(port: int, *parts: bytes, pause: float = 0.0) -> bytes:
    """Send `parts` with `pause` seconds between them; everything read until the server closes."""
    reader, writer = await asyncio.open_connection("127.0.0.1", port)
    try:
        for part in parts:
            writer.write(part)
            await writer.drain()
            await asyncio.sleep(pause)
        return await asyncio.wait_for(reader.read(), 10)
    except ConnectionError:
        return b""
    finally:
        writer.close()


async def test_a_trickling_head_is_cut_at_the_header_timeout():
    limits = ConnectionLimits(header_timeout=0.5, body_timeout=5)
    async with _serving(limits) as port:
        loop = asyncio.get_running_loop()
        start = loop.time()
        # nothing at all, then a head one header every 0.2 s: both closed, unanswered
        assert await _exchange(port) == b""
        trickle = [b"POST / HTTP/1.1\r\n", *[b"X-A: b\r\n"] * 10]
        assert await _exchange(port, *trickle, pause=0.2) == b""
        assert loop.time() - start < 5
        ok = await _exchange(port, b"GET / HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
        assert ok.startswith(b"HTTP/1.1 200")


async def test_a_trickling_body_is_a_408_and_a_large_one_a_413():
    limits = ConnectionLimits(header_timeout=5, body_timeout=0.5)
    async with _serving(limits) as port:
        head = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n"
        late = await _exchange(port, head, b"x" * 10, pause=1.0)
        assert late.startswith(b"HTTP/1.1 408") and b"did not arrive" in late
        big = b"POST / HTTP/1.1\r\nHost: x\r\nContent-Length: 20000000\r\n\r\n"
        assert (await _exchange(port, big)).startswith(b"HTTP/1.1 413")
        whole = await _exchange(port, head.replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n"))
        assert whole == b"" or whole.startswith(b"HTTP/1.1 408")  # no body sent at all
        fine = head.replace(b"100", b"3").replace(b"\r\n\r\n", b"\r\nConnection: close\r\n\r\n")
        answered = await _exchange(port, fine + b"abc")
        assert answered.startswith(b"HTTP/1.1 200") and answered.endswith(b"\r\n\r\n3")


@pytest.mark.timeout(60)
async def test_connections_beyond_the_limit_get_a_503():
    async with _serving(ConnectionLimits(max_connections=2)) as port:
        slow = b"GET /slow HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        first = asyncio.create_task(_exchange(port, slow))
        await asyncio.sleep(0.5)  # in the app now, for 2 s: the connection limit is reached
        later = await _exchange(port, slow)
        assert (await first).startswith(b"HTTP/1.1 200") and later.startswith(b"HTTP/1.1 503")


def test_the_defaults_are_documented():
    from pathlib import Path

    text = (Path(__file__).parents[2] / "docs" / "security.md").read_text()
    rows = {row.split(" | ")[0]: row for row in text.splitlines() if row.startswith("| `--")}
    limits = ConnectionLimits()
    for option, value in (
        ("| `--max-connections`", limits.max_connections),
        ("| `--header-timeout` (`LOCALCHAT_HEADER_TIMEOUT`)", limits.header_timeout),
        ("| `--body-timeout` (`LOCALCHAT_BODY_TIMEOUT`)", limits.body_timeout),
    ):
        assert f" | {value:g}" in rows[option], option
    assert (limits.header_timeout, limits.body_timeout) == (
        envs.HEADER_TIMEOUT.default,
        envs.BODY_TIMEOUT.default,
    )


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        ("LOCALCHAT_HEADER_TIMEOUT", "0", "--header-timeout must be > 0, got 0.0"),
        ("LOCALCHAT_BODY_TIMEOUT", "-1", "--body-timeout must be > 0, got -1.0"),
    ],
)
def test_serve_takes_its_timeouts_from_the_environment(tmp_path, variable, value, message):
    """The variable reaches serve's check, which runs before the model is looked for (the path
    given does not exist: without the variable, that is the error)."""
    command = [sys.executable, "-m", "localchat", "serve", str(tmp_path / "none"), "--port", "0"]
    env = {**os.environ, variable: value}
    result = subprocess.run(command, capture_output=True, text=True, env=env, timeout=120)
    assert result.returncode == 2, result.stderr
    assert message in result.stderr and "Traceback" not in result.stderr
