"""The session's own environment: every test (and every process one starts) uses a Hugging Face
cache of the run's own, no directory's settings leak into the rest of the session, and a test
outside the slow ones (the fast subset) can neither load the default model nor start a server."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests import conftest


def test_every_test_uses_a_temporary_hugging_face_cache():
    import huggingface_hub.constants

    home = Path(conftest.HF_HOME)
    assert Path(os.environ["HF_HOME"]) == home and "HF_TOKEN" not in os.environ
    assert Path(huggingface_hub.constants.HF_HUB_CACHE).is_relative_to(home)
    assert Path(huggingface_hub.constants.HF_TOKEN_PATH).is_relative_to(home)
    code = "import huggingface_hub.constants as c; print(c.HF_HUB_CACHE)"
    child = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert Path(child.stdout.strip()).is_relative_to(home)


def test_the_triton_interpreter_is_set_only_inside_the_kernel_tests():
    """tests/kernels interprets the Triton kernels; the servers and CLIs other tests start must
    not inherit TRITON_INTERPRET=1."""
    assert os.environ.get("TRITON_INTERPRET") == conftest.TRITON_INTERPRET_AT_START


def test_a_test_not_marked_slow_loads_no_default_model_and_starts_no_server(tmp_path):
    from localchat import LLM
    from tests import serve_process

    start_a_server = serve_process.serve_process  # (called by that name, it would mark this slow)
    with pytest.raises(AssertionError, match="real default model"):
        LLM()
    with pytest.raises(AssertionError, match="server process"), start_a_server(tmp_path / "log"):
        pass
