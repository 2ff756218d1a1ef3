"""Tensor parallelism joined from torchrun's environment: two torchrun "nodes" on this machine
(`--nnodes 2 --nproc-per-node 1`, gloo over 127.0.0.1), each running the same localchat command
line, against one process."""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
import pytest

from tests.engine.distributed.test_tensor_parallel import TINY_LLAMA

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
PROMPT = "Name three colors."
# generate's flags, the same on every rank
GENERATE = ["--raw", "-t", "0", "-n", "16", "--kv-cache-memory", "16MiB", "--load-format", "dummy"]


@pytest.fixture
def master_port():
    """A port for torchrun's store, held for the test: bound (never listening) with SO_REUSEADDR,
    so the store, which binds it the same way, can listen on it, while no other process is given
    it between its choice and the store's start (a probed and released port could be)."""
    with socket.socket() as held:
        held.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        held.bind(("127.0.0.1", 0))
        yield held.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_model(default_gguf, tmp_path_factory) -> Path:
    """A model directory that splits over 2 ranks (8 query heads, 2 KV heads), random weights
    (--load-format dummy, seeded), and the default model's tokenizer, so its output is text."""
    from localchat.engine.loading.loader import model_files
    from localchat.models.source import resolve_model

    directory = tmp_path_factory.mktemp("tiny")
    source = model_files(resolve_model(None)).directory
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, directory / name)
    # the default model's vocabulary, for its tokenizer
    config = {**TINY_LLAMA, "vocab_size": 49152, "max_position_embeddings": 1024}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _nodes(
    port: int, command: list[str], logs: Path, env: dict[str, str] | None = None
) -> list[subprocess.Popen]:
    """Node 1 then node 0 of a 2-node torchrun job, each one process, the same command line."""
    processes = []
    for node in (1, 0):
        launcher = [
            *TORCHRUN,
            "--nnodes",
            "2",
            "--nproc-per-node",
            "1",
            "--node-rank",
            str(node),
            "--master-addr",
            "127.0.0.1",
            "--master-port",
            str(port),
            "--no-python",
            sys.executable,
            "-m",
            "localchat",
            *command,
        ]
        with open(logs / f"node{node}.out", "w") as out, open(logs / f"node{node}.err", "w") as err:
            processes.append(subprocess.Popen(launcher, stdout=out, stderr=err, env=env))
    return processes


def _wait(processes: list[subprocess.Popen], timeout: float) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_nodes_generate_the_text_of_one_process_and_both_exit_cleanly(
    tiny_model, tmp_path, master_port
):
    command = ["generate", "-m", str(tiny_model), *GENERATE]
    alone = subprocess.run(
        [sys.executable, "-m", "localchat", *command, PROMPT],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.strip()
    node1, node0 = _nodes(master_port, [*command, "-tp", "2", PROMPT], tmp_path)
    assert _wait([node0, node1], timeout=240) == [0, 0], (tmp_path / "node1.err").read_text()
    assert (tmp_path / "node0.out").read_text() == alone.stdout
    assert (tmp_path / "node1.out").read_text() == ""  # rank 1 never sees a tokenizer's text
    rank1 = (tmp_path / "node1.err").read_text()
    assert "rank 1 of 2: ready" in rank1 and "rank 1 of 2: rank 0 is done; exiting" in rank1


def _serve_on_two_nodes(
    model: Path, logs: Path, port: int, env: dict[str, str] | None = None
) -> tuple[subprocess.Popen, subprocess.Popen, str]:
    """Node 1's and node 0's torchrun, and the URL rank 0 serves on once it says so."""
    command = ["serve", str(model), "--load-format", "dummy", "--kv-cache-memory", "16MiB"]
    node1, node0 = _nodes(port, [*command, "-tp", "2", "--port", "0"], logs, env)
    deadline = time.monotonic() + 240
    while True:
        log = (logs / "node0.err").read_text()
        if found := re.search(r"on (http://127\.0\.0\.1:\d+)", log):
            return node1, node0, found.group(1)
        if node0.poll() is not None or node1.poll() is not None or time.monotonic() > deadline:
            _wait([node0, node1], timeout=1)
            raise AssertionError(f"not serving:\n{log}\n{(logs / 'node1.err').read_text()}")
        time.sleep(0.5)


def _rank_process(launcher: subprocess.Popen) -> psutil.Process:
    """The localchat process a torchrun launcher started (its one rank)."""
    children = psutil.Process(launcher.pid).children()
    ranks = [c for c in children if "localchat" in " ".join(c.cmdline())]
    assert len(ranks) == 1, children
    return ranks[0]


def test_two_nodes_serve_rank_0_answers_and_rank_1_exits_with_it(tiny_model, tmp_path, master_port):
    reference = subprocess.run(
        [sys.executable, "-m", "localchat", "generate", "-m", str(tiny_model), *GENERATE, PROMPT],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert reference.returncode == 0, reference.stderr
    node1, node0, url = _serve_on_two_nodes(tiny_model, tmp_path, master_port)
    try:
        assert "serving" not in (tmp_path / "node1.err").read_text()  # rank 1 binds no port
        body = {"prompt": PROMPT, "max_tokens": 16, "temperature": 0}
        reply = httpx.post(f"{url}/v1/completions", json=body, timeout=120)
        assert reply.status_code == 200, reply.text
        assert reply.json()["choices"][0]["text"] == reference.stdout.rstrip("\n")
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
    finally:
        if node0.poll() is None:
            node0.send_signal(signal.SIGTERM)  # torchrun passes it to rank 0: a clean shutdown
    codes = _wait([node0, node1], timeout=120)
    rank1 = (tmp_path / "node1.err").read_text()
    assert "rank 1 of 2: rank 0 is done; exiting" in rank1, rank1
    assert codes[1] == 0


def test_a_hung_rank_on_the_other_node_turns_rank_0_unhealthy(tiny_model, tmp_path, master_port):
    """Rank 1 is not rank 0's child (no exit to see): the idle ping finds it hung."""
    env = {**os.environ, "LOCALCHAT_TP_PING_TIMEOUT": "3"}
    node1, node0, url = _serve_on_two_nodes(tiny_model, tmp_path, master_port, env)
    rank1 = _rank_process(node1)
    try:
        assert httpx.get(f"{url}/health", timeout=10).status_code == 200
        rank1.send_signal(signal.SIGSTOP)
        deadline = time.monotonic() + 30
        while (health := httpx.get(f"{url}/health", timeout=10)).status_code == 200:
            assert time.monotonic() < deadline, "still healthy 30 s after rank 1 hung"
            time.sleep(0.3)
        assert "rank 1 did not answer a health ping within 3 s (hung)" in health.json()["detail"]
        body = {"prompt": PROMPT, "max_tokens": 4}
        assert httpx.post(f"{url}/v1/completions", json=body, timeout=30).status_code == 503
    finally:
        node0.send_signal(signal.SIGTERM)
        with contextlib.suppress(psutil.NoSuchProcess):
            rank1.kill()  # SIGKILL ends a stopped process too
        _wait([node0, node1], timeout=60)


def test_the_other_ranks_exit_nonzero_when_rank_0_dies(tiny_model, tmp_path, master_port):
    node1, node0, _ = _serve_on_two_nodes(tiny_model, tmp_path, master_port)
    try:
        _rank_process(node0).kill()
        started = time.monotonic()
        assert _wait([node1], timeout=60) == [1]  # torchrun reports its rank's failure
        assert time.monotonic() - started < 30
    finally:
        _wait([node0], timeout=60)
    assert "rank 1 of 2: " in (tmp_path / "node1.err").read_text()


def _refused(env: dict[str, str], *command: str) -> str:
    """localchat's stderr, after checking that it exited 2 without a traceback."""
    result = subprocess.run(
        [sys.executable, "-m", "localchat", *command],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    assert "Traceback" not in result.stderr
    return result.stderr


def test_world_size_other_than_tp_is_refused_with_a_clear_message(master_port):
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(master_port),
    }
    stderr = _refused(env, "generate", "-tp", "3", "hello")
    assert "torchrun started 2 processes (WORLD_SIZE=2) but --tensor-parallel-size is 3" in stderr


def test_a_partial_torchrun_environment_is_refused():
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    for name in ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    stderr = _refused(env, "serve", "-tp", "2", "--port", "0")
    assert "RANK and WORLD_SIZE are set but not LOCAL_RANK, MASTER_ADDR, MASTER_PORT" in stderr
