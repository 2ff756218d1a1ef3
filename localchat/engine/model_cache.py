"""Convert a GGUF file's config and tokenizer once into a small Hugging Face style directory in the
cache.

Converting the GGUF tokenizer with transformers takes seconds; the converted directory (config.json,
generation_config.json, tokenizer files, the GGUF's tensor table) loads in milliseconds. The weights
are never copied: they are read from the GGUF file itself at every load (memory-mapped, quantized
blocks kept).
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

import platformdirs

from localchat.engine.model_source import _say

_FORMAT_VERSION = 3
TENSOR_INDEX = "gguf_tensors.json"  # where the file's tensors are (GGUFCheckpoint.tensor_index)


def cache_root() -> Path:
    root = os.environ.get("LOCALCHAT_CACHE_DIR") or platformdirs.user_cache_dir("localchat")
    return Path(root)


def converted_dir(gguf_path: Path) -> Path:
    stat = gguf_path.stat()
    return (
        cache_root()
        / "gguf"
        / f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}-v{_FORMAT_VERSION}"
    )


def ensure_converted(gguf_path: Path, progress: Callable[[str], None] | None = None) -> Path:
    """The converted directory for `gguf_path`, creating it on first use."""
    target = converted_dir(gguf_path)
    if (target / "done").is_file():
        return target
    _say(progress, f"reading the tokenizer of {gguf_path.name} (first run only) ...")
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=target.name + ".", dir=target.parent))
    try:
        _convert(gguf_path, staging)
        (staging / "done").write_text("ok\n")
        try:
            staging.rename(target)
        except OSError:  # another process finished first
            shutil.rmtree(staging, ignore_errors=True)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    return target


def _convert(gguf_path: Path, out: Path) -> None:
    from transformers import AutoTokenizer

    from localchat.engine.gguf_checkpoint import GGUFCheckpoint

    checkpoint = GGUFCheckpoint(gguf_path)
    config = checkpoint.hf_config()
    config.save_pretrained(out)
    (out / TENSOR_INDEX).write_text(json.dumps(checkpoint.tensor_index()))
    generation = {"eos_token_id": config.eos_token_id, "bos_token_id": config.bos_token_id}
    (out / "generation_config.json").write_text(json.dumps(generation))
    tokenizer = AutoTokenizer.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
    tokenizer.save_pretrained(out)
