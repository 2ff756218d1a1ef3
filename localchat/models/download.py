"""Download one hub file into the Hugging Face cache layout (blobs/, snapshots/, refs/), resumable
across runs and verified against the hub's checksum before it is used.

huggingface_hub's own `hf_hub_download` resumes a dropped connection within one call but deletes
its partial file when the call ends, so an interrupted pull would start over. Here the partial
file is kept (`blobs/<etag>.localchat-partial`) and huggingface_hub's `http_get` continues it with
a Range request; the finished blob lands where `hf_hub_download` and `scan_cache_dir` find it.
"""

from __future__ import annotations

import hashlib
import os
import re
import shutil
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from localchat.errors import ModelDownloadError

PARTIAL_SUFFIX = ".localchat-partial"
_HASH_CHUNK = 1 << 20
_COMMIT = re.compile(r"[0-9a-f]{40}")
_ETAG = re.compile(r"[A-Za-z0-9._-]{1,255}")  # one file name: hex on the hub, a mirror's own too


@dataclass(frozen=True)
class RemoteFile:
    """A file of a repo at one commit, with what the hub says it is: its size, and its sha256
    (LFS files) or git blob id (small files)."""

    repo_id: str
    filename: str
    commit: str
    size: int | None = None
    sha256: str | None = None
    git_sha1: str | None = None


def check_filename(name: str) -> str:
    """A file name the hub lists, as it becomes a path under snapshots/<commit>/: relative, in `/`
    separated parts that are none of '', '.', '..', with no backslash and no control character."""
    parts = name.split("/")
    if (
        not name
        or any(part in ("", ".", "..") or len(part.encode()) > 255 for part in parts)
        or any(ord(c) < 32 or ord(c) == 127 or c == "\\" for c in name)
    ):
        raise ModelDownloadError(f"the hub lists an unsafe file name {name!r}; not downloaded")
    return name


def check_commit(commit: str) -> str:
    """A commit id the hub sends, as it becomes snapshots/<commit>: 40 lowercase hex digits."""
    if not _COMMIT.fullmatch(commit):
        raise ModelDownloadError(f"the hub sent {commit!r} as a commit id; expected 40 hex digits")
    return commit


def check_etag(etag: str, url: str) -> str:
    """An ETag, as it becomes blobs/<etag>: one file name of letters, digits, '.', '_', '-'."""
    if not _ETAG.fullmatch(etag) or etag in (".", ".."):
        raise ModelDownloadError(f"{url}: the server sent an unusable ETag {etag!r}; not trusted")
    return etag


def storage_dir(cache: Path, repo_id: str) -> Path:
    """The repo's folder in the hub cache (`models--owner--name`)."""
    return cache / ("models--" + repo_id.replace("/", "--"))


def snapshot_path(cache: Path, remote: RemoteFile) -> Path:
    return storage_dir(cache, remote.repo_id) / "snapshots" / remote.commit / remote.filename


def fetch_file(
    remote: RemoteFile,
    cache: Path,
    *,
    endpoint: str,
    token: str | None,
    tqdm_class: Callable[..., Any] | None = None,
) -> Path:
    """The file's snapshot path, downloading (or resuming) and verifying it first if needed."""
    check_filename(remote.filename)
    check_commit(remote.commit)
    from huggingface_hub import get_hf_file_metadata, hf_hub_url

    pointer = snapshot_path(cache, remote)
    if pointer.exists():
        return pointer
    url = hf_hub_url(remote.repo_id, remote.filename, revision=remote.commit, endpoint=endpoint)
    meta = get_hf_file_metadata(url, token=token, endpoint=endpoint, timeout=5)
    if not meta.etag:
        raise ModelDownloadError(f"{url}: the server sent no ETag; is HF_ENDPOINT a hub?")
    check_etag(meta.etag, url)
    size = meta.size if meta.size is not None else remote.size
    if remote.size is not None and size != remote.size:
        raise ModelDownloadError(
            f"{remote.filename}: the hub lists {remote.size} bytes but serves {size}; not trusted"
        )
    blob = storage_dir(cache, remote.repo_id) / "blobs" / meta.etag
    if not blob.exists():
        blob.parent.mkdir(parents=True, exist_ok=True)
        partial = blob.with_name(blob.name + PARTIAL_SUFFIX)
        _download(meta.location, partial, size, endpoint, token, remote.filename, tqdm_class)
        _verify(partial, remote, meta.etag)
        os.replace(partial, blob)
    _link(blob, pointer)
    return pointer


def _download(
    location: str,
    partial: Path,
    size: int | None,
    endpoint: str,
    token: str | None,
    filename: str,
    tqdm_class: Callable[..., Any] | None,
) -> None:
    from huggingface_hub.file_download import http_get
    from huggingface_hub.utils import build_hf_headers

    done = partial.stat().st_size if partial.exists() else 0
    if size is not None and done > size:  # not a prefix of this file: start over
        partial.unlink()
        done = 0
    headers = build_hf_headers(token=token)
    if urlparse(location).netloc != urlparse(endpoint).netloc:
        headers.pop("authorization", None)  # a CDN must not see the token
    with open(partial, "ab") as out:
        http_get(
            location,
            out,
            resume_size=done,
            headers=headers,
            expected_size=size,
            displayed_filename=filename,
            tqdm_class=tqdm_class,  # type: ignore[arg-type]
        )


def _verify(path: Path, remote: RemoteFile, etag: str) -> None:
    """Compare the file with the hub's sha256 (LFS) or git blob id; a mismatch deletes it."""
    if remote.sha256 or (remote.git_sha1 is None and len(etag) == 64):
        kind, expected = "sha256", remote.sha256 or etag
    elif remote.git_sha1 or len(etag) == 40:
        kind, expected = "git", remote.git_sha1 or etag
    else:
        return  # no checksum offered (a plain mirror): http_get has checked the size
    actual = _sha256(path) if kind == "sha256" else _git_sha1(path)
    if actual != expected.lower():
        path.unlink(missing_ok=True)
        raise ModelDownloadError(
            f"{remote.filename}: checksum mismatch ({kind} {actual}, the hub says {expected}); "
            "the download was discarded, run the pull again"
        )


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _git_sha1(path: Path) -> str:
    """git's blob id: sha1 of 'blob <size>\\0' and the content."""
    digest = hashlib.sha1(f"blob {path.stat().st_size}\0".encode())
    with open(path, "rb") as handle:
        while chunk := handle.read(_HASH_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _link(blob: Path, pointer: Path) -> None:
    """snapshots/<commit>/<file> -> ../../blobs/<etag> (a relative symlink, or a copy where the
    file system has none)."""
    pointer.parent.mkdir(parents=True, exist_ok=True)
    try:
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    except FileExistsError:
        pass
    except OSError:
        shutil.copyfile(blob, pointer)


def write_ref(cache: Path, repo_id: str, revision: str, commit: str) -> None:
    """refs/<revision> holds the commit its snapshot belongs to (how the cache finds 'main')."""
    check_commit(commit)
    ref = storage_dir(cache, repo_id) / "refs" / revision
    ref.parent.mkdir(parents=True, exist_ok=True)
    ref.write_text(commit)
