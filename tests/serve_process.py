"""A real `localchat serve` subprocess on a free port, for the tests that talk HTTP to it."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import httpx

IN_FAST_TEST = False  # set by tests/conftest.py while a test outside the slow ones runs


class ServeProcess:
    """The process, its base URL (`http://127.0.0.1:PORT`) and its log."""

    def __init__(self, process: subprocess.Popen, base_url: str, log_path: Path):
        self.process, self.base_url, self.log_path = process, base_url, log_path

    def log(self) -> str:
        return self.log_path.read_text()


def _wait_until_healthy(process: subprocess.Popen, log_path: Path, timeout: float) -> str:
    deadline = time.monotonic() + timeout
    url = None
    while True:
        if url is None and (
            match := re.search(r"on (http://127\.0\.0\.1:\d+)", log_path.read_text())
        ):
            url = match.group(1)
        if url is not None and httpx.get(f"{url}/health").status_code == 200:
            return url
        if process.poll() is not None:
            raise RuntimeError(
                f"localchat serve exited with {process.returncode}:\n{log_path.read_text()}"
            )
        if time.monotonic() > deadline:
            raise RuntimeError(
                f"localchat serve was not healthy within {timeout}s:\n{log_path.read_text()}"
            )
        time.sleep(0.2)


@contextmanager
def serve_process(
    log_path: Path, *args: str, api_key: str | None = None, timeout: float = 240
) -> Iterator[ServeProcess]:
    """Start `localchat serve --port 0 ARGS` (the default model unless ARGS name one), wait until
    /health answers 200, and stop it with SIGTERM afterwards (killed if it takes over 60 s)."""
    assert not IN_FAST_TEST, "this test starts a server process: mark it slow"
    env = {**os.environ, **({"LOCALCHAT_API_KEY": api_key} if api_key else {})}
    with open(log_path, "w") as log:
        process = subprocess.Popen(
            [sys.executable, "-m", "localchat", "serve", "--port", "0", *args],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
        )
    try:
        yield ServeProcess(process, _wait_until_healthy(process, log_path, timeout), log_path)
    finally:
        if process.poll() is None:
            process.send_signal(signal.SIGTERM)
        try:
            process.wait(timeout=60)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
