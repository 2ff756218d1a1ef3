"""Convert a GGUF file's config and tokenizer once into a small Hugging Face style directory in the
cache.

Converting the GGUF tokenizer with transformers takes seconds; the converted directory (config.json,
generation_config.json, tokenizer files, the GGUF's tensor table) loads in milliseconds. The weights
are never copied: they are read from the GGUF file itself at every load (memory-mapped, quantized
blocks kept).
"""

from __future__ import annotations

import json
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

from localchat.errors import InvalidModelFileError
from localchat.models.file_lock import locked
from localchat.models.notice import Progress, say
from localchat.models.paths import CONVERTED_FORMAT, converted_dir
from localchat.utils import write_private

TENSOR_INDEX = "gguf_tensors.json"  # where the file's tensors are (GGUFCheckpoint.tensor_index)
# Written last: every other file's name and size. A directory without it, or whose files differ
# from it (cut short, deleted), is half-written and is rebuilt, never trusted.
MANIFEST = "manifest.json"


def ensure_converted(gguf_path: Path, progress: Progress | None = None) -> Path:
    """The converted directory for `gguf_path`, creating it on first use (`build_once`)."""
    return build_once(
        converted_dir(gguf_path),
        lambda out: _convert(gguf_path, out),
        lambda: say(progress, f"reading the tokenizer of {gguf_path.name} (first run only) ..."),
    )


def build_once(
    target: Path, build: Callable[[Path], None], announce: Callable[[], None] | None = None
) -> Path:
    """`target`, a cache directory whose files `build` writes (into the directory it is given),
    built on first use (`announce` called first).

    It is built in a staging directory and renamed into place whole, under a file lock, so a
    process killed mid-way leaves no directory that looks finished, and processes preparing the
    same directory at once build it once and all get the same one.
    """
    if is_complete(target):
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with locked(target.parent / f"{target.name}.lock") as exclusive:
        if is_complete(target):  # another process built it while this one waited
            return target
        _remove_leftovers(target, staging_too=exclusive)
        if announce is not None:
            announce()
        staging = Path(tempfile.mkdtemp(prefix=f"{target.name}.", dir=target.parent))
        try:
            build(staging)
            _write_manifest(staging)
            try:
                staging.rename(target)
            except OSError:  # no lock here (Windows) and another process finished first
                if not is_complete(target):
                    raise
                shutil.rmtree(staging, ignore_errors=True)
        except BaseException:
            shutil.rmtree(staging, ignore_errors=True)
            raise
    return target


def is_complete(directory: Path) -> bool:
    """Whether `directory` holds every file its manifest lists, each of the listed size."""
    try:
        manifest = json.loads((directory / MANIFEST).read_text())
        files = manifest["files"]
        return manifest["format"] == CONVERTED_FORMAT and all(
            (directory / name).stat().st_size == size for name, size in files.items()
        )
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return False


def _write_manifest(directory: Path) -> None:
    files = {p.name: p.stat().st_size for p in sorted(directory.iterdir()) if p.is_file()}
    write_private(directory / MANIFEST, json.dumps({"format": CONVERTED_FORMAT, "files": files}))


def _remove_leftovers(target: Path, staging_too: bool) -> None:
    """Delete a half-written `target` and, with `staging_too` (under the lock, when no live process
    is writing one), the staging directories of killed processes."""
    for path in target.parent.iterdir():
        staging = staging_too and path.name.startswith(f"{target.name}.")
        if path.is_dir() and (path == target or staging):
            shutil.rmtree(path, ignore_errors=True)


# Tokens that end a turn in chat templates (as llama.cpp, which stops on them by their text too):
# Gemma's <end_of_turn>, gpt-oss's <|return|> and <|call|>, ChatML's <|im_end|>, Phi-3's <|end|>,
# Llama 3's <|eot_id|> and <|eom_id|>
END_OF_TURN = (
    *("<end_of_turn>", "<|return|>", "<|call|>", "<|im_end|>", "<|end|>", "<|eot_id|>"),
    "<|eom_id|>",
)
_CONTROL = 3  # llama.cpp's token type of special tokens


def _convert(gguf_path: Path, out: Path) -> None:
    from localchat.engine.loading.gguf_checkpoint import GGUFCheckpoint

    checkpoint = GGUFCheckpoint(gguf_path)
    config = checkpoint.hf_config()
    (out / TENSOR_INDEX).write_text(json.dumps(checkpoint.tensor_index()))
    config.save_pretrained(out)
    eos = _eos_ids(checkpoint)
    generation = {"eos_token_id": eos if len(eos) > 1 else config.eos_token_id}
    generation["bos_token_id"] = config.bos_token_id
    (out / "generation_config.json").write_text(json.dumps(generation))
    try:
        tokenizer = _tokenizer(gguf_path, config.model_type)
    except MemoryError:
        raise
    except Exception as exc:  # transformers' and tokenizers' (a bare Exception) reading the file
        what = " ".join(f"{type(exc).__name__}: {exc}".split())
        raise InvalidModelFileError(
            f"{gguf_path.name}: its tokenizer cannot be read ({what[:300]})"
        ) from None
    tokenizer.save_pretrained(out)


def _eos_ids(checkpoint) -> list[int]:
    """The ids that end a reply: the file's EOS, its end-of-turn and end-of-message ids, and the
    special tokens that end a turn by their text (END_OF_TURN), EOS first."""
    ids = [checkpoint.field(f"tokenizer.ggml.{key}_token_id") for key in ("eos", "eot", "eom")]
    tokens = checkpoint.field("tokenizer.ggml.tokens")
    types = checkpoint.field("tokenizer.ggml.token_type")
    if isinstance(tokens, list) and isinstance(types, list):
        wanted = set(END_OF_TURN)
        for position, (text, kind) in enumerate(zip(tokens, types, strict=False)):
            if text in wanted and kind == _CONTROL:
                ids.append(position)
    return list(dict.fromkeys(int(i) for i in ids if i is not None))


def _tokenizer(gguf_path: Path, model_type: str):
    """The file's tokenizer, as transformers builds it from GGUF metadata, in the class its
    AutoTokenizer gives the model type, without transformers' check that it can load the model
    itself (it cannot for several of llama.cpp's architectures, and parsing the whole file for that
    takes seconds)."""
    from transformers.models.auto.tokenization_auto import (
        TOKENIZER_MAPPING_NAMES,
        tokenizer_class_from_name,
    )
    from transformers.tokenization_utils_tokenizers import TokenizersBackend

    name = TOKENIZER_MAPPING_NAMES.get(model_type)
    cls = (tokenizer_class_from_name(name) if name else None) or TokenizersBackend
    return cls.from_pretrained(str(gguf_path.parent), gguf_file=gguf_path.name)
