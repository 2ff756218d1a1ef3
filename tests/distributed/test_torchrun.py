"""Tensor parallelism joined from torchrun's environment: two torchrun "nodes" on this machine
(`--nnodes 2 --nproc-per-node 1`, gloo over 127.0.0.1), each running the same localchat command
line, against one process."""

from __future__ import annotations

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
import pytest

from tests.distributed.test_tensor_parallel import TINY_LLAMA

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]

TORCHRUN = [sys.executable, "-m", "torch.distributed.run"]
PROMPT = "Name three colors."
# generate's flags, the same on every rank
GENERATE = ["--raw", "-t", "0", "-n", "16", "--kv-cache-memory", "16MiB", "--load-format", "dummy"]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


@pytest.fixture(scope="module")
def tiny_model(default_gguf, tmp_path_factory) -> Path:
    """A model directory that splits over 2 ranks (8 query heads, 2 KV heads), random weights
    (--load-format dummy, seeded), and the default model's tokenizer, so its output is text."""
    from localchat.engine.loader import model_files
    from localchat.engine.model_source import resolve_model

    directory = tmp_path_factory.mktemp("tiny")
    source = model_files(resolve_model(None)).directory
    for name in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(source / name, directory / name)
    # the default model's vocabulary, for its tokenizer
    config = {**TINY_LLAMA, "vocab_size": 49152, "max_position_embeddings": 1024}
    (directory / "config.json").write_text(json.dumps(config))
    return directory


def _nodes(port: int, command: list[str], logs: Path) -> list[subprocess.Popen]:
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
            processes.append(subprocess.Popen(launcher, stdout=out, stderr=err))
    return processes


def _wait(processes: list[subprocess.Popen], timeout: float) -> list[int]:
    try:
        return [p.wait(timeout=timeout) for p in processes]
    finally:
        for p in processes:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_nodes_generate_the_text_of_one_process_and_both_exit_cleanly(tiny_model, tmp_path):
    command = ["generate", "-m", str(tiny_model), *GENERATE]
    alone = subprocess.run(
        [sys.executable, "-m", "localchat", *command, PROMPT],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert alone.returncode == 0, alone.stderr
    assert alone.stdout.strip()
    node1, node0 = _nodes(_free_port(), [*command, "-tp", "2", PROMPT], tmp_path)
    assert _wait([node0, node1], timeout=240) == [0, 0], (tmp_path / "node1.err").read_text()
    assert (tmp_path / "node0.out").read_text() == alone.stdout
    assert (tmp_path / "node1.out").read_text() == ""  # rank 1 never sees a tokenizer's text
    rank1 = (tmp_path / "node1.err").read_text()
    assert "rank 1 of 2: ready" in rank1 and "rank 1 of 2: rank 0 is done; exiting" in rank1


def test_two_nodes_serve_rank_0_answers_and_rank_1_exits_with_it(tiny_model, tmp_path):
    reference = subprocess.run(
        [sys.executable, "-m", "localchat", "generate", "-m", str(tiny_model), *GENERATE, PROMPT],
        capture_output=True,
        text=True,
        timeout=180,
    )
    assert reference.returncode == 0, reference.stderr
    command = ["serve", str(tiny_model), "--load-format", "dummy", "--kv-cache-memory", "16MiB"]
    command += ["-tp", "2", "--port", "0"]
    node1, node0 = _nodes(_free_port(), command, tmp_path)
    try:
        deadline = time.monotonic() + 240
        url = None
        while url is None:
            log = (tmp_path / "node0.err").read_text()
            assert node0.poll() is None and node1.poll() is None, log
            assert time.monotonic() < deadline, log
            found = re.search(r"on (http://127\.0\.0\.1:\d+)", log)
            url = found.group(1) if found else None
            time.sleep(0.5)
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


def test_world_size_other_than_tp_is_refused_with_a_clear_message():
    env = {
        **os.environ,
        "RANK": "0",
        "WORLD_SIZE": "2",
        "LOCAL_RANK": "0",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(_free_port()),
    }
    stderr = _refused(env, "generate", "-tp", "3", "hello")
    assert "torchrun started 2 processes (WORLD_SIZE=2) but --tensor-parallel-size is 3" in stderr


def test_a_partial_torchrun_environment_is_refused():
    env = {**os.environ, "RANK": "0", "WORLD_SIZE": "2"}
    for name in ("LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    stderr = _refused(env, "serve", "-tp", "2", "--port", "0")
    assert "RANK and WORLD_SIZE are set but not LOCAL_RANK, MASTER_ADDR, MASTER_PORT" in stderr
