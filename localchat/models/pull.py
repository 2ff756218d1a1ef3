"""`localchat pull REPO[:FILE_OR_QUANT]`: choose a repo's files (a safetensors checkpoint, or one
GGUF file by name or quantization tag, with llama.cpp's image encoder of the model, an mmproj file,
where the repo has one), then download each into the hub cache, resumed and verified."""

from __future__ import annotations

import fnmatch
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.console import Console

from localchat.errors import ModelDownloadError, ModelNotFoundError
from localchat.models import hub
from localchat.models.download import (
    RemoteFile,
    check_commit,
    check_filename,
    fetch_file,
    snapshot_path,
    write_ref,
)
from localchat.models.names import (
    HubRef,
    choose_mmproj,
    is_mmproj,
    is_split_gguf,
    quant_of_filename,
)
from localchat.models.progress import bar_factory, download_progress

HUB_TIMEOUT_S = 5.0  # for the file list and each file's metadata: a silent hub fails fast
DEFAULT_QUANT = "q4_k_m"  # what ollama and llama.cpp's `-hf` pick when no tag is given
# the files of a safetensors checkpoint the engine reads (weights, config, tokenizer, template)
HF_DIR_PATTERNS = (
    "*.json",
    "*.safetensors",
    "*.model",
    "*.txt",
    "*.jinja",
    "tokenizer*",
)
_GGUF_COMPANIONS = ("generation_config.json",)


@dataclass(frozen=True)
class PullPlan:
    """What one pull downloads: `kind` 'gguf' (one model file, `files[0]`, with its image encoder
    where the repo has one) or 'hf_dir'."""

    ref: HubRef
    commit: str
    kind: str
    files: tuple[RemoteFile, ...]

    @property
    def total_bytes(self) -> int:
        return sum(f.size or 0 for f in self.files)

    @property
    def mmproj(self) -> str | None:
        """The image encoder (mmproj*.gguf) pulled with a GGUF model, if any."""
        return next((f.filename for f in self.files if is_mmproj(f.filename)), None)


@dataclass(frozen=True)
class Pulled:
    """A finished pull: the model's path (the GGUF file or the snapshot directory)."""

    plan: PullPlan
    path: Path


def plan_pull(ref: HubRef, *, endpoint: str, token: str | None) -> PullPlan:
    """Ask the hub for the repo's file list (with sizes and checksums) and pick the files."""
    from huggingface_hub import HfApi

    with _hub_errors(ref):
        info = HfApi(endpoint=endpoint, token=token).model_info(
            ref.repo_id, files_metadata=True, timeout=HUB_TIMEOUT_S
        )
    commit = info.sha
    if not commit:
        raise ModelDownloadError(f"{endpoint}: no commit id for {ref.repo_id}; is it a hub?")
    check_commit(commit)  # each name and id becomes a path in the cache: checked before
    siblings = {s.rfilename: s for s in info.siblings or []}
    kind, names = _choose(ref, sorted(siblings))
    files = []
    for name in names:
        check_filename(name)
        sibling = siblings[name]
        files.append(
            RemoteFile(
                ref.repo_id,
                name,
                commit,
                size=sibling.lfs.size if sibling.lfs else sibling.size,
                sha256=sibling.lfs.sha256 if sibling.lfs else None,
                git_sha1=None if sibling.lfs else sibling.blob_id,
            )
        )
    return PullPlan(ref, commit, kind, tuple(files))


def _choose(ref: HubRef, names: list[str]) -> tuple[str, list[str]]:
    """('gguf', [file, its image encoder if the repo has one, companions...]) or ('hf_dir',
    files), or a clear error listing choices."""
    ggufs = [n for n in names if n.lower().endswith(".gguf") and not is_mmproj(n)]
    spec = ref.spec.lower() if ref.spec else None
    if spec is not None and is_mmproj(spec):
        raise ModelNotFoundError(
            f"{ref}: {ref.spec} is an image encoder (mmproj), pulled with its model; "
            f"pull the model ({ref.repo_id}:QUANT) and it comes too"
        )
    has_weights = "config.json" in names and any(n.endswith(".safetensors") for n in names)
    if spec is None and has_weights:
        chosen = [n for n in names if any(fnmatch.fnmatch(n, p) for p in HF_DIR_PATTERNS)]
        return "hf_dir", chosen
    if not ggufs:
        what = f"no GGUF file matching {ref.spec!r}" if ref.spec else "no safetensors or GGUF"
        raise ModelNotFoundError(f"{ref.repo_id}: {what} in this repo")
    if spec is None:
        matches = [n for n in ggufs if quant_of_filename(n) == DEFAULT_QUANT]
        if not matches and len(ggufs) == 1:
            matches = ggufs
    elif spec.endswith(".gguf"):
        matches = [n for n in ggufs if n.lower() == spec or n.lower().rsplit("/", 1)[-1] == spec]
    else:
        matches = [n for n in ggufs if quant_of_filename(n) == spec]
    if len(matches) != 1 or is_split_gguf(matches[0]):
        raise ModelNotFoundError(_choice_message(ref, ggufs, matches))
    companions = [n for n in names if n in _GGUF_COMPANIONS]
    # llama.cpp's image encoder of the model, in the same folder: of its precision, else f16
    folder = matches[0].rpartition("/")[0]
    mmproj = choose_mmproj([n for n in names if n.rpartition("/")[0] == folder], matches[0])
    return "gguf", [matches[0], *([mmproj] if mmproj else []), *companions]


def _choice_message(ref: HubRef, ggufs: list[str], matches: list[str]) -> str:
    if matches and all(is_split_gguf(m) for m in matches):
        return f"{ref}: split GGUF files ({matches[0]}, ...) are not supported; pick another"
    tags = sorted({q for q in map(quant_of_filename, ggufs) if q})
    choices = ", ".join(f"{ref.repo_id}:{t}" for t in tags) or ", ".join(ggufs)
    if len(matches) > 1:
        return f"{ref}: several GGUF files match ({', '.join(matches)}); name the file"
    wanted = f"no GGUF file for {ref.spec!r}" if ref.spec else "several GGUF files"
    return f"{ref.repo_id}: {wanted}; choose one of: {choices}"


def pull(ref: HubRef, console: Console | None = None) -> Pulled:
    """Download what `ref` names into the hub cache (skipping what is there), with a progress
    bar; fails fast with a clear message when the hub cannot be reached."""
    endpoint, token, cache = hub.endpoint(), hub.token(), hub.cache_dir()
    hub.require_reachable(endpoint)
    plan = plan_pull(ref, endpoint=endpoint, token=token)
    progress = download_progress(console)
    with progress, _hub_errors(ref):
        for remote in plan.files:
            fetch_file(
                remote,
                cache,
                endpoint=endpoint,
                token=token,
                tqdm_class=bar_factory(progress, remote.filename),
            )
    write_ref(cache, ref.repo_id, "main", plan.commit)
    first = snapshot_path(cache, plan.files[0])
    return Pulled(plan, first if plan.kind == "gguf" else first.parent)


@contextmanager
def _hub_errors(ref: HubRef) -> Iterator[None]:
    """Turn huggingface_hub's and the network's exceptions into one-line ModelDownloadErrors."""
    import httpx2
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        yield
    except GatedRepoError as exc:
        raise ModelDownloadError(
            f"{ref.repo_id} is gated: accept its license on the hub and set HF_TOKEN"
        ) from exc
    except (RepositoryNotFoundError, RevisionNotFoundError) as exc:
        raise ModelNotFoundError(
            f"{ref.repo_id}: no such model on {hub.endpoint()} (private? set HF_TOKEN)"
        ) from exc
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 404:
            raise ModelNotFoundError(f"{ref.repo_id}: no such model on {hub.endpoint()}") from exc
        raise ModelDownloadError(f"{ref}: the hub answered {_first_line(exc)}") from exc
    except httpx2.TimeoutException as exc:
        raise ModelDownloadError(
            f"the model hub at {hub.endpoint()} did not answer in time ({_first_line(exc)}); "
            "check the network or proxy, or set HF_ENDPOINT to a reachable mirror"
        ) from exc
    except (OSError, ValueError, httpx2.HTTPError) as exc:  # network, size mismatch, disk full
        raise ModelDownloadError(f"{ref}: download failed: {_first_line(exc)}") from exc


def _first_line(exc: Any) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0]
