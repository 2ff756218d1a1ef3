"""Find the files behind a MODEL argument: a local HF directory, a .gguf file, a name from
`localchat list`, a cached (or downloadable) hub id, or the embedded default."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from localchat.errors import ModelNotFoundError
from localchat.models import hub
from localchat.models.default_model import (
    DEFAULT_MODEL_NAME,
    find_default_gguf,
    pull_default_model,
)
from localchat.models.names import choose_mmproj, is_mmproj, looks_like_hub_ref
from localchat.models.notice import Progress, say
from localchat.models.registry import find


@dataclass(frozen=True)
class ModelSource:
    """Where a model's files are: `kind` is 'hf_dir' (config.json, weights, tokenizer) or 'gguf';
    for a GGUF file in a model directory or a pulled repo, `mmproj` is llama.cpp's image encoder
    found beside it (models/names.choose_mmproj), if any."""

    kind: str
    path: Path
    name: str
    mmproj: Path | None = None


def resolve_model(
    model: str | None, *, pull: bool = True, progress: Progress | None = None
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
            ggufs = sorted(p for p in path.glob("*.gguf") if not is_mmproj(p.name))
            if len(ggufs) == 1:
                return ModelSource(
                    "gguf", ggufs[0].resolve(), ggufs[0].stem, mmproj_beside(ggufs[0])
                )
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
    entry = find(model)
    if entry is not None:
        pulled = entry.kind == "gguf" and _in_hub_cache(entry.path)  # an alias of one too
        mmproj = mmproj_beside(entry.path) if pulled else None
        return ModelSource(entry.kind, entry.path, model, mmproj)
    if ":" in model and looks_like_hub_ref(model):
        raise ModelNotFoundError(
            f"model {model!r} is not pulled yet; run `localchat pull {model}` first"
        )
    return None


def mmproj_beside(gguf: Path) -> Path | None:
    """The image encoder (`mmproj*.gguf`) in the GGUF file's folder that goes with it, if any."""
    chosen = choose_mmproj([p.name for p in gguf.parent.glob("*.gguf")], gguf.name)
    return None if chosen is None else (gguf.parent / chosen).absolute()


def _in_hub_cache(path: Path) -> bool:
    """Whether `path` is a file of a pulled repo (in the hub cache's snapshots)."""
    return path.absolute().is_relative_to(hub.cache_dir().absolute())


def _looks_like_hub_id(model: str) -> bool:
    parts = model.split("/")
    return len(parts) == 2 and all(parts) and not model.startswith((".", "/", "~"))


_HUB_PATTERNS = ["*.json", "*.safetensors", "*.model", "*.txt", "*.jinja", "tokenizer*"]


def _from_hub(repo_id: str, progress: Progress | None = None) -> Path:
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
    say(progress, f"downloading {repo_id} from {host} ...")
    try:
        return Path(snapshot_download(repo_id, allow_patterns=_HUB_PATTERNS))
    except Exception as exc:
        raise ModelNotFoundError(f"could not download {repo_id!r}: {exc}") from exc


def _reachable(host: str, timeout: float = 3.0) -> bool:
    """A TCP connect with a hard deadline (DNS included), so an offline machine fails in seconds."""
    return hub.probe(host, 443, timeout) is None
