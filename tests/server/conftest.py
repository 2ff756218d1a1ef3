"""One real `localchat serve` process per test session (default model, a free port, an API key), and
clients for it: raw httpx, the openai package, and a Prometheus metrics reader."""

from __future__ import annotations

import signal
import subprocess
import threading
import time

import httpx
import pytest

from tests.serve_process import serve_process

API_KEY = "test-key-123"
MAX_MODEL_LEN = 1024
MAX_NUM_SEQS = 16
MAX_WAITING = 4


@pytest.fixture(scope="session")
def server(default_gguf, tmp_path_factory):
    """The server process. At the end it gets SIGTERM while a stream runs: the stream must still
    finish (data: [DONE]) and the process exit with status 0."""
    log_path = tmp_path_factory.mktemp("server") / "serve.log"
    args = [
        "--max-model-len",
        str(MAX_MODEL_LEN),
        "--max-num-seqs",
        str(MAX_NUM_SEQS),
        "--max-waiting",
        str(MAX_WAITING),
        "--kv-cache-memory",
        "256MiB",
        "--grace-period",
        "20",
        "--threads",
        "1",
    ]  # one core for the server, one for the tests
    with serve_process(log_path, *args, api_key=API_KEY, timeout=180) as server:
        yield server
        stream_lines = _terminate_during_stream(server.process, server.base_url)
    assert server.process.returncode == 0, (
        f"serve exited with {server.process.returncode} after SIGTERM:\n{server.log()}"
    )
    assert stream_lines[-1] == "data: [DONE]", stream_lines


def _terminate_during_stream(process: subprocess.Popen, base_url: str) -> list[str]:
    """Send SIGTERM once a stream has begun; return that stream's SSE data lines."""
    lines: list[str] = []
    body = {"prompt": "Once upon a time", "max_tokens": 8, "ignore_eos": True, "stream": True}

    def consume():
        with httpx.stream(
            "POST",
            f"{base_url}/v1/completions",
            json=body,
            timeout=60,
            headers={"Authorization": f"Bearer {API_KEY}"},
        ) as response:
            for line in response.iter_lines():
                if line.startswith("data: "):
                    lines.append(line)

    reader = threading.Thread(target=consume)
    reader.start()
    deadline = time.monotonic() + 30
    while not lines and reader.is_alive() and time.monotonic() < deadline:
        time.sleep(0.01)
    process.send_signal(signal.SIGTERM)
    reader.join(timeout=60)
    return lines


@pytest.fixture(scope="session")
def base_url(server) -> str:
    return server.base_url


@pytest.fixture(scope="session")
def http(base_url):
    with httpx.Client(
        base_url=base_url, headers={"Authorization": f"Bearer {API_KEY}"}, timeout=120
    ) as client:
        yield client


@pytest.fixture(scope="session")
def openai_client(base_url):
    import openai

    return openai.OpenAI(base_url=f"{base_url}/v1", api_key=API_KEY, max_retries=0, timeout=120)


def _read_metrics(base_url: str) -> dict[str, float]:
    """Prometheus samples by name (with labels, as in the text format)."""
    samples = {}
    key = {"Authorization": f"Bearer {API_KEY}"}  # /metrics takes the key the server has
    for line in httpx.get(f"{base_url}/metrics", headers=key).text.splitlines():
        if line and not line.startswith("#"):
            name, _, value = line.rpartition(" ")
            samples[name] = float(value)
    return samples


def _wait_until_idle(base_url: str, timeout: float = 10.0) -> dict[str, float]:
    """Metrics once nothing runs or waits (fails after `timeout` seconds)."""
    deadline = time.monotonic() + timeout
    while True:
        metrics = _read_metrics(base_url)
        if (
            metrics["localchat_num_requests_running"] == 0
            and metrics["localchat_num_requests_waiting"] == 0
        ):
            return metrics
        assert time.monotonic() < deadline, f"requests still running after {timeout}s: {metrics}"
        time.sleep(0.05)


@pytest.fixture(scope="session")
def metrics(base_url):
    """metrics() -> the server's current Prometheus samples by name."""
    return lambda: _read_metrics(base_url)


@pytest.fixture(scope="session")
def wait_idle(base_url):
    """wait_idle(timeout) -> metrics once no request runs or waits."""
    return lambda timeout=10.0: _wait_until_idle(base_url, timeout)
