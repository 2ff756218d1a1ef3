"""`localchat pull` against a fake hub: the right files, resumed, verified, fast failures."""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest

from localchat.models.download import PARTIAL_SUFFIX, storage_dir
from tests.models.conftest import GGUF_FILE, GGUF_NAME, GGUF_REPO, ST_NAME, ST_REPO


def _blob(cache, repo_id, data: bytes):
    return storage_dir(cache, repo_id) / "blobs" / hashlib.sha256(data).hexdigest()


def test_pull_gguf_by_quant_tag_downloads_only_that_file_and_it_generates(
    cli, hub_cache, fake_hub, llm
):
    data = fake_hub.repos[GGUF_REPO].files[GGUF_FILE]
    result = cli("pull", f"{GGUF_REPO}:Q4_1")
    assert result.exit_code == 0, result.output
    assert f"pulled {GGUF_NAME}" in result.stdout
    assert "93.8 MiB" in result.stderr  # the progress bar's bytes
    blob = _blob(hub_cache, GGUF_REPO, data)
    assert hashlib.sha256(blob.read_bytes()).digest() == hashlib.sha256(data).digest()
    gets = [r["path"] for r in fake_hub.requests if r["method"] == "GET"]
    assert not any("Q8_0" in p or "README" in p for p in gets), gets

    from localchat import LLM, SamplingParams

    pulled = LLM(GGUF_NAME, kv_cache_memory="64MiB", max_model_len=256)
    params = SamplingParams(temperature=0, max_tokens=12)
    prompt = "The capital of France is"
    assert pulled.generate([prompt], params)[0].text == llm.generate([prompt], params)[0].text
    # pulled again: nothing is downloaded
    before = len(fake_hub.ranges(GGUF_FILE))
    assert cli("pull", f"{GGUF_REPO}:{GGUF_FILE}").exit_code == 0
    assert len(fake_hub.ranges(GGUF_FILE)) == before


def test_pull_safetensors_repo_honours_hf_token(cli, hub_cache, fake_hub, monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "hf_secret")
    result = cli("pull", ST_REPO)
    assert result.exit_code == 0, result.output
    assert f"pulled {ST_NAME}" in result.stdout
    snapshot = storage_dir(hub_cache, ST_REPO) / "snapshots" / fake_hub.repos[ST_REPO].commit
    names = sorted(p.name for p in snapshot.iterdir())
    assert "model.safetensors" in names and "generation_config.json" in names
    assert "tokenizer.json" in names and "README.md" not in names
    assert all(r["authorization"] == "Bearer hf_secret" for r in fake_hub.requests)

    import torch
    from transformers import AutoModelForCausalLM

    from localchat import LLM, SamplingParams

    out = LLM(ST_NAME, kv_cache_memory="16MiB", max_model_len=128).generate(
        ["Hello, my name is"], SamplingParams(temperature=0, max_tokens=8, ignore_eos=True)
    )[0]
    # the weights the hub served: transformers, on the pulled snapshot, continues as we do
    reference = AutoModelForCausalLM.from_pretrained(snapshot, dtype=torch.float32).eval()
    prompt = torch.tensor([out.prompt_token_ids])
    with torch.no_grad():
        mask = torch.ones_like(prompt)
        expected = reference.generate(
            prompt, attention_mask=mask, do_sample=False, max_new_tokens=8, min_new_tokens=8
        )
    assert out.token_ids == expected[0, prompt.shape[1] :].tolist()


def test_a_dropped_connection_resumes_with_a_range_request(cli, hub_cache, fake_hub):
    """Cut after 15 MiB: huggingface_hub wrote the first 10 MiB chunk (it writes in chunks of
    that size) and asks for the rest."""
    fake_hub.behaviour.drop_file, fake_hub.behaviour.drop_after = GGUF_FILE, 15 << 20
    fake_hub.behaviour.drop_times = 1
    result = cli("pull", f"{GGUF_REPO}:q4_1")
    assert result.exit_code == 0, result.output
    assert fake_hub.ranges(GGUF_FILE) == [None, f"bytes={10 << 20}-"]
    data = fake_hub.repos[GGUF_REPO].files[GGUF_FILE]
    assert _blob(hub_cache, GGUF_REPO, data).read_bytes() == data


def _pull_process(ref: str) -> subprocess.Popen:
    env = {k: v for k, v in os.environ.items() if k != "HF_HUB_OFFLINE"}
    return subprocess.Popen(
        [sys.executable, "-m", "localchat", "pull", ref],
        env=env,
        # Ctrl+C as in a terminal: a suite started in the background (`cmd &` in a script) has
        # SIGINT ignored, and a child inherits that
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def test_an_interrupted_pull_resumes_where_it_stopped(hub_cache, fake_hub):
    """Ctrl+C mid-file keeps the partial file (20 MiB: two whole 10 MiB chunks of the 21 MiB
    received); the next pull asks only for the rest."""
    fake_hub.behaviour.stall_file, fake_hub.behaviour.stall_after = GGUF_FILE, 21 << 20
    data = fake_hub.repos[GGUF_REPO].files[GGUF_FILE]
    blob = _blob(hub_cache, GGUF_REPO, data)
    partial = blob.with_name(blob.name + PARTIAL_SUFFIX)
    first = _pull_process(f"{GGUF_REPO}:q4_1")
    deadline = time.monotonic() + 60
    while not (partial.exists() and partial.stat().st_size >= 20 << 20):
        assert time.monotonic() < deadline and first.poll() is None, first.communicate()
        time.sleep(0.1)
    first.send_signal(signal.SIGINT)
    _, err = first.communicate(timeout=30)
    assert first.returncode == 130 and "resumes" in err and "Traceback" not in err, err
    assert partial.stat().st_size == 20 << 20 and not blob.exists()

    second = _pull_process(f"{GGUF_REPO}:q4_1")
    _, err = second.communicate(timeout=120)
    assert second.returncode == 0, err
    assert fake_hub.ranges(GGUF_FILE) == [None, f"bytes={20 << 20}-"]
    assert blob.read_bytes() == data and not partial.exists()


@pytest.mark.parametrize("bad_file", ["x.Q4_0.gguf", "config.json"])
def test_a_checksum_mismatch_is_refused(cli, hub_cache, fake_hub, bad_file):
    """An LFS file (sha256) or a small file (git blob id) whose bytes differ from the hub's
    checksum is discarded, and nothing of it is listed."""
    from tests.models.fake_hub import Repo

    files = {"x.Q4_0.gguf": os.urandom(200_000), "config.json": b'{"model_type": "llama"}'}
    fake_hub.repos["acme/bad"] = Repo(files)
    fake_hub.behaviour.corrupt = {bad_file}
    ref = "acme/bad:q4_0" if bad_file.endswith(".gguf") else "acme/bad"
    if not bad_file.endswith(".gguf"):
        files["model.safetensors"] = b"\0" * 16
    result = cli("pull", ref)
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert "checksum mismatch" in result.stderr and bad_file in result.stderr
    blobs = storage_dir(hub_cache, "acme/bad") / "blobs"
    assert not any(p.name.endswith(PARTIAL_SUFFIX) for p in blobs.iterdir())
    snapshots = storage_dir(hub_cache, "acme/bad") / "snapshots"
    assert not list(snapshots.rglob(bad_file))
    assert "acme/bad" not in cli("list", "--json").stdout


@pytest.fixture
def silent_server():
    """A TCP server that accepts connections and never answers."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    held: list[socket.socket] = []
    stop = threading.Event()

    def accept() -> None:
        server.settimeout(0.2)
        while not stop.is_set():
            with contextlib.suppress(OSError):
                held.append(server.accept()[0])

    thread = threading.Thread(target=accept, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.getsockname()[1]}"
    stop.set()
    thread.join()
    for conn in held:
        conn.close()
    server.close()


@pytest.fixture
def closed_port():
    """The URL of a port bound, never listened on, and held for the test: a connection to it is
    refused, and no other process can take it meanwhile."""
    with socket.socket() as bound:
        bound.bind(("127.0.0.1", 0))
        yield f"http://127.0.0.1:{bound.getsockname()[1]}"


@dataclasses.dataclass
class Connection:
    address: tuple
    waits: list[float | None]  # every timeout set on the socket: the longest each wait may last


@pytest.fixture
def connections(monkeypatch) -> list[Connection]:
    """Every TCP connection the test's process tries (the hub probe's, huggingface_hub's), with
    the timeouts its connect and reads may wait."""
    tried: list[Connection] = []

    class Recorded(socket.socket):
        def settimeout(self, value):
            self.__dict__.setdefault("waits", []).append(value)
            super().settimeout(value)

        def connect(self, address):
            tried.append(Connection(address, self.__dict__.setdefault("waits", [])))
            super().connect(address)

    monkeypatch.setattr(socket, "socket", Recorded)  # what socket.create_connection makes
    return tried


@pytest.mark.parametrize("where", ["refused", "no-dns", "silent"])
def test_an_unreachable_hub_fails_fast_with_a_clear_message(
    cli, hub_cache, monkeypatch, closed_port, silent_server, connections, where
):
    """Fast by construction, not by a stopwatch: a probe and at most one request (no retries), and
    every wait of theirs bounded by a timeout of a few seconds."""
    endpoint = {"refused": closed_port, "no-dns": "http://hub.invalid", "silent": silent_server}[
        where
    ]
    monkeypatch.setenv("HF_ENDPOINT", endpoint)
    result = cli("pull", "Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m")
    assert result.exit_code == 2 and "Traceback" not in result.output
    assert endpoint in result.stderr and (
        "cannot reach" in result.stderr or "in time" in result.stderr
    )
    # refused: the probe's connection only; no DNS: none; silent: the probe's and the file list's
    assert len(connections) == {"refused": 1, "no-dns": 0, "silent": 2}[where], connections
    for connection in connections:
        assert connection.waits and all(
            wait is not None and 0 < wait <= 5 for wait in connection.waits
        ), connection


def test_choosing_files_names_the_choices(cli, hub_cache, fake_hub):
    result = cli("pull", f"{GGUF_REPO}:q2_k")
    assert result.exit_code == 2
    assert f"{GGUF_REPO}:q4_1" in result.stderr and f"{GGUF_REPO}:q8_0" in result.stderr
    result = cli("pull", "acme/nothing-here")
    assert result.exit_code == 2 and "no such model" in result.stderr
    result = cli("pull", "not a repo")
    assert result.exit_code == 2 and "OWNER/NAME" in result.stderr


def test_offline_mode_is_named(cli, hub_cache, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    result = cli("pull", ST_REPO)
    assert result.exit_code == 2 and "HF_HUB_OFFLINE" in result.stderr
