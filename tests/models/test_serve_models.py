"""`localchat serve --models` / `--models-dir`: several models behind one server, picked by the
request's `model`, loaded on first use, evicted least-recently-used under --max-loaded-models and
--max-memory, unloaded after their keep_alive; real server processes and the openai client."""

from __future__ import annotations

import asyncio
import time
from contextlib import contextmanager
from pathlib import Path

import httpx
import pytest

from tests.models.conftest import ST_NAME, ST_REPO
from tests.models.test_registry import _hand_made_cache
from tests.serve_process import serve_process

DEFAULT = "smollm2-135m-instruct:q4_1"
SMALL = ["--kv-cache-memory", "32MiB", "--max-model-len", "256", "--threads", "1"]


def _rss_mib(pid: int) -> float:
    with open(f"/proc/{pid}/status") as status:
        line = next(x for x in status if x.startswith("VmRSS:"))
    return int(line.split()[1]) / 1024


@contextmanager
def _serve(log_path: Path, *args: str):
    """`localchat serve ARGS` (the server picks its port) until /health answers; SIGTERM
    afterwards."""
    with serve_process(log_path, *args, *SMALL, timeout=120) as server:
        yield server.base_url, server.process


def _sample(url: str, name: str) -> float:
    """One sample of the server's /metrics, by its name with labels."""
    lines = httpx.get(f"{url}/metrics").text.splitlines()
    return float(next(line.rpartition(" ")[2] for line in lines if line.startswith(f"{name} ")))


def _cards(url: str) -> dict[str, dict]:
    return {card["id"]: card for card in httpx.get(f"{url}/v1/models").json()["data"]}


async def _wait_unloaded(url: str, name: str) -> float:
    """Seconds until `name` is unloaded (a minute at most: a deadline against a hang, not a
    measure of speed)."""
    start = time.monotonic()
    while _cards(url)[name]["loaded"]:
        assert time.monotonic() - start < 60, f"{name} still loaded after 60 s"
        await asyncio.sleep(0.1)
    return time.monotonic() - start


def _client(url: str):
    from openai import AsyncOpenAI

    return AsyncOpenAI(base_url=f"{url}/v1", api_key="none", max_retries=0, timeout=120)


async def _ask(client, model: str, **extra) -> str:
    reply = await client.chat.completions.create(
        model=model,
        messages=[{"role": "user", "content": "Hi"}],
        max_tokens=6,
        temperature=0,
        extra_body=extra or None,
    )
    assert reply.model == model
    return reply.choices[0].message.content or ""


@pytest.fixture
def two_models(hub_cache, tiny_llama_files, tmp_path):
    """The default GGUF and a tiny safetensors llama, at most one loaded."""
    _hand_made_cache(hub_cache, ST_REPO, tiny_llama_files)
    with _serve(
        tmp_path / "serve.log", "--models", f"{DEFAULT},{ST_NAME}", "--max-loaded-models", "1"
    ) as server:
        yield server


def test_two_models_one_server(two_models, cli):
    url, process = two_models
    models = httpx.get(f"{url}/v1/models").json()["data"]
    assert [m["id"] for m in models] == [DEFAULT, ST_NAME]
    assert not any(m["loaded"] for m in models)
    assert httpx.get(f"{url}/v1/models/{ST_NAME}").json()["id"] == ST_NAME
    assert httpx.get(f"{url}/v1/models/nope").status_code == 404
    rss = asyncio.run(_scenario(url, process.pid))
    # (for the eye only: the allocator decides when heap goes back. That the pool lets an evicted
    # engine go, tests/models/test_engine_pool.py checks by its references)
    print(f"RSS (MiB) after each of {DEFAULT}, {ST_NAME} x3, one loaded at a time: {rss}")
    cards = _cards(url)
    assert [n for n, c in cards.items() if c["loaded"]] == [ST_NAME]
    assert cards[ST_NAME]["memory_bytes"] > 32 * 2**20  # its weights and the 32 MiB KV pool
    assert cards[ST_NAME]["keep_alive_seconds"] == 300  # the default, 5m
    assert 0 < cards[ST_NAME]["unloads_in_seconds"] <= 300

    metrics = httpx.get(f"{url}/metrics").text
    assert f'localchat_generation_tokens_total{{model_name="{ST_NAME}"}}' in metrics
    success = [x for x in metrics.splitlines() if x.startswith("localchat_request_success_total")]
    assert success and all(f'model_name="{ST_NAME}"' in x for x in success)
    assert "localchat_models_loaded 1.0" in metrics
    assert f'localchat_model_memory_bytes{{model_name="{ST_NAME}"}}' in metrics
    # an embedding's input tokens count in its model's prompt tokens, by exactly its usage
    prompt_tokens = f'localchat_prompt_tokens_total{{model_name="{ST_NAME}"}}'
    before = _sample(url, prompt_tokens)
    body = {"model": ST_NAME, "input": ["Hello there", "A second input"]}
    usage = httpx.post(f"{url}/v1/embeddings", json=body, timeout=60).json()["usage"]
    assert usage["prompt_tokens"] > 2
    assert _sample(url, prompt_tokens) - before == usage["prompt_tokens"]

    table = [line.split() for line in cli("ps", "--url", url).stdout.splitlines()]
    assert table[0] == ["NAME", "LOADED", "MEMORY", "CONTEXT", "IDLE", "UNTIL"]
    assert table[1] == [DEFAULT, "no", "-", "-", "-", "-"]
    assert table[2][:2] == [ST_NAME, "yes"] and table[2][2].endswith("MiB")
    assert table[2][3] == "256" and "in" in table[2][5:]  # UNTIL: in 4m 58s
    down = cli("ps", "--url", "http://127.0.0.1:9")
    assert down.exit_code == 2 and "no localchat server answered" in down.stderr


async def _scenario(url: str, pid: int) -> list[float]:
    from openai import BadRequestError, NotFoundError

    client = _client(url)
    # interleaved and concurrent: every request succeeds, the engines swapped as needed
    replies = await asyncio.gather(*(_ask(client, m) for m in [DEFAULT, ST_NAME] * 3))
    # (not compared with each other: a batch's greedy text may differ from a lone request's)
    assert len(replies) == 6 and all(replies)
    with pytest.raises(NotFoundError, match="does not exist"):
        await _ask(client, "no-such-model")
    with pytest.raises(BadRequestError) as bad:
        await _ask(client, ST_NAME, keep_alive="soon")
    assert bad.value.body["param"] == "keep_alive" and "not a duration" in bad.value.message
    # one at a time, alternating: each request unloads the other model (the pool's counter)
    swaps = 0 if _cards(url)[DEFAULT]["loaded"] else 1
    unloads = _sample(url, "localchat_model_unloads_total")
    rss = []
    for model in [DEFAULT, ST_NAME] * 3:
        await _ask(client, model)
        rss.append(_rss_mib(pid))
        loaded = [name for name, card in _cards(url).items() if card["loaded"]]
        assert loaded == [model] and _sample(url, "localchat_models_loaded") == 1
    assert _sample(url, "localchat_model_unloads_total") - unloads == 5 + swaps
    await client.close()
    return rss


def test_models_dir_memory_budget_and_keep_alive(models_dir, tmp_path):
    from localchat.config import EngineConfig
    from localchat.server.multimodel.pool import EnginePool

    estimate = EnginePool(
        {"tiny-a": str(models_dir / "tiny-a"), "smol": str(models_dir / "smol.gguf")},
        EngineConfig(kv_cache_memory="32MiB"),
        lambda *_: None,
    )
    tiny, smol = estimate.need("tiny-a").total, estimate.need("smol").total
    assert tiny < smol
    budget = tiny * 3 // 2  # one tiny llama fits, two do not, the GGUF alone does not
    args = ["--models-dir", str(models_dir), "--max-loaded-models", "3", "--keep-alive", "-1"]
    args.append("--allow-client-unload")  # the requests below shorten their models' keep_alive
    with _serve(tmp_path / "serve.log", *args, "--max-memory", str(budget)) as (url, _):
        assert list(_cards(url)) == ["smol", "tiny-a", "tiny-b"]
        asyncio.run(_budget_scenario(url))
        log = (tmp_path / "serve.log").read_text()
    assert "smol needs about" in log  # warned at startup


async def _budget_scenario(url: str) -> None:
    from openai import BadRequestError

    client = _client(url)
    with pytest.raises(BadRequestError, match="more than the server's --max-memory") as big:
        await _ask(client, "smol")
    assert big.value.body["param"] == "model"
    await _ask(client, "tiny-a")
    # the budget holds one: tiny-b's load evicts tiny-a, though --max-loaded-models allows 3
    await asyncio.gather(_ask(client, "tiny-b"), _ask(client, "tiny-b"))
    cards = _cards(url)
    assert not cards["tiny-a"]["loaded"] and cards["tiny-b"]["loaded"]
    assert cards["tiny-b"]["unloads_in_seconds"] is None  # --keep-alive -1: forever
    # a request's keep_alive becomes its model's: 0 unloads it once the reply is sent
    unloads = _sample(url, "localchat_model_unloads_total")
    await _ask(client, "tiny-b", keep_alive=0)
    print(f"keep_alive=0: unloaded {await _wait_unloaded(url, 'tiny-b'):.2f} s after")
    assert _sample(url, "localchat_model_unloads_total") == unloads + 1
    # "1s": due a second after the last request, then unloaded by the background task (nothing
    # else unloads it: no request follows)
    await _ask(client, "tiny-a", keep_alive="1s")
    card = _cards(url)["tiny-a"]
    assert card["keep_alive_seconds"] == 1 and 0 <= card["unloads_in_seconds"] <= 1
    print(f"keep_alive=1s: unloaded {await _wait_unloaded(url, 'tiny-a'):.2f} s after the reply")
    assert _sample(url, "localchat_model_unloads_total") == unloads + 2
    await client.close()


def test_loaded_models_answer_while_another_loads(models_dir, tmp_path):
    args = ["--models-dir", str(models_dir), "--max-loaded-models", "2"]
    with _serve(tmp_path / "serve.log", *args) as (url, _):
        asyncio.run(_while_loading(url))


async def _while_loading(url: str) -> None:
    client = _client(url)
    await _ask(client, "tiny-a")  # loaded
    loading = asyncio.ensure_future(_ask(client, "smol"))  # loads in its engine's own thread
    started, answered = time.monotonic(), []
    while not loading.done():
        await _ask(client, "tiny-a")
        if not loading.done():
            answered.append(time.monotonic() - started)
    took = time.monotonic() - started
    await loading
    # (how many were answered meanwhile is the machine's timing, printed, not asserted: that a
    # load keeps no request to a loaded engine waiting, test_engine_pool.py holds a load back
    # to show)
    print(f"smol loaded and answered in {took:.2f} s; tiny-a answered {len(answered)} meanwhile")
    assert all(card["loaded"] for name, card in _cards(url).items() if name != "tiny-b")
    # both loaded, hit at once: two engines step at the same time in one process
    replies = await asyncio.gather(*(_ask(client, m) for m in ["smol", "tiny-a"] * 4))
    assert len(replies) == 8 and all(replies[::2])  # (the random tiny llama may say nothing)
    assert httpx.get(f"{url}/version").json()["version"]
    await client.close()


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-memory", "lots"], "max_memory='lots' is not a size"),
        (["--max-memory", "0"], "max_memory must be positive"),
        (["--keep-alive", "soon"], "keep_alive='soon' is not a duration"),
        (["--max-loaded-models", "0"], "--max-loaded-models must be >= 1"),
        (["--models-dir", "/no/such/dir"], "not a directory"),
        (["--models", "no-such-model"], "not found"),
    ],
)
def test_bad_flags_are_clear_errors(cli, default_gguf, flags, message):
    args = ["serve", *(["--models", DEFAULT] if "--models" not in flags else []), *flags]
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr


def test_model_and_models_are_exclusive(cli, default_gguf):
    result = cli("serve", "x", "--models", DEFAULT)
    assert result.exit_code == 2 and "not both" in result.stderr
    alone = cli("serve", "--keep-alive", "1m")  # a single-model server keeps its model loaded
    assert alone.exit_code == 2 and "go with --models or --models-dir" in alone.stderr


def test_keep_alive_values():
    from localchat.errors import InvalidParameterError
    from localchat.server.keep_alive import format_duration, parse_keep_alive

    assert parse_keep_alive("5m") == 300 and parse_keep_alive("1h30m") == 5400
    assert parse_keep_alive(0) == 0 and parse_keep_alive("0") == 0
    assert parse_keep_alive("500ms") == 0.5 and parse_keep_alive(12.5) == 12.5
    assert parse_keep_alive(-1) is None and parse_keep_alive("-1m") is None
    for bad in ("", "5 minutes", "m", "5x", True, [], "nan", float("inf")):
        with pytest.raises(InvalidParameterError, match="not a duration"):
            parse_keep_alive(bad)
    assert [format_duration(s) for s in (None, 45, 250, 7500)] == [
        "forever",
        "45s",
        "4m 10s",
        "2h 5m",
    ]
