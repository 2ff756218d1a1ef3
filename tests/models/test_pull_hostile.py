"""A hostile hub (the fake hub serving crafted names) cannot make `pull` write outside the hub
cache, and `rm` never follows a link out of it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from localchat.models.download import storage_dir
from localchat.models.hub import cache_dir
from tests.models.fake_hub import FakeHub, Repo

REPO = "acme/hostile"
GOOD_COMMIT = "0123456789abcdef0123456789abcdef01234567"
MODEL = b"GGUF, or so it says: the user's own file"


@pytest.fixture
def hostile_hub(hub_cache, monkeypatch):
    """An empty fake hub, HF_ENDPOINT pointing at it; the test adds its repo."""
    with FakeHub({}) as hub:
        monkeypatch.setenv("HF_ENDPOINT", hub.url)
        yield hub


def _outside(tmp_path: Path) -> list[str]:
    """What is in the test's folder besides the hub cache (hf-hub)."""
    return sorted(p.name for p in tmp_path.iterdir() if p.name != "hf-hub")


@pytest.mark.parametrize(
    "name",
    ["../../../../escape.Q4_0.gguf", "ABSOLUTE", "x\n.Q4_0.gguf", "a\\..\\x.Q4_0.gguf"],
)
def test_a_hostile_file_name_is_refused_before_it_becomes_a_path(
    cli, hub_cache, hostile_hub, tmp_path, name
):
    if name == "ABSOLUTE":
        name = str(tmp_path / "abs.Q4_0.gguf")
    hostile_hub.repos[REPO] = Repo({name: os.urandom(20_000)})
    hostile_hub.behaviour.anywhere = REPO
    result = cli("pull", f"{REPO}:q4_0")
    assert result.exit_code != 0
    assert "unsafe file name" in result.output, result.output
    assert _outside(tmp_path) == []


def test_a_hostile_commit_id_is_refused(cli, hub_cache, hostile_hub, tmp_path):
    hostile_hub.repos[REPO] = Repo({"x.Q4_0.gguf": os.urandom(20_000)}, commit="../../../evil")
    result = cli("pull", f"{REPO}:q4_0")
    assert result.exit_code != 0 and "commit id" in result.output, result.output
    assert _outside(tmp_path) == []


def test_a_hostile_etag_is_refused(cli, hub_cache, hostile_hub, tmp_path):
    hostile_hub.repos[REPO] = Repo({"x.Q4_0.gguf": os.urandom(20_000)})
    hostile_hub.behaviour.etags["x.Q4_0.gguf"] = "../../../evil"
    result = cli("pull", f"{REPO}:q4_0")
    assert result.exit_code != 0 and "ETag" in result.output, result.output
    assert _outside(tmp_path) == []
    assert not (storage_dir(hub_cache, REPO) / "snapshots").exists()


def test_the_checks_accept_what_the_hub_sends():
    from localchat.models.download import check_commit, check_etag, check_filename

    assert check_filename("sub/dir/model-Q4_K_M.gguf") == "sub/dir/model-Q4_K_M.gguf"
    assert check_commit(GOOD_COMMIT) == GOOD_COMMIT
    assert check_etag("a" * 64, "u") and check_etag("5f3c-1a2b", "u")
    for bad in ("", "a//b", "./a", "a/.", "a\x00b", "a\x7fb", "x" * 256):
        with pytest.raises(Exception, match="unsafe"):
            check_filename(bad)
    for bad in (GOOD_COMMIT.upper(), GOOD_COMMIT[:-1], "main"):
        with pytest.raises(Exception, match="commit id"):
            check_commit(bad)
    for bad in ("..", ".", "a/b", "a\nb", ""):
        with pytest.raises(Exception, match="ETag"):
            check_etag(bad, "u")


def _cached_repo(hub_cache: Path, files: dict[str, Path]) -> Path:
    """A repo folder in the hub cache whose snapshot holds `files` as links to their targets."""
    repo = storage_dir(hub_cache, REPO)
    (repo / "blobs").mkdir(parents=True)
    snapshot = repo / "snapshots" / GOOD_COMMIT
    snapshot.mkdir(parents=True)
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(GOOD_COMMIT)
    for name, target in files.items():
        (snapshot / name).symlink_to(target)
    return repo


def test_rm_removes_a_link_out_of_the_cache_not_its_target(cli, hub_cache, tmp_path):
    precious = tmp_path / "precious.gguf"
    precious.write_bytes(MODEL)
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "model.Q4_0.gguf").write_bytes(b"the user's own file")
    repo = _cached_repo(hub_cache, {"model.Q4_0.gguf": precious})
    # a second snapshot that is a link to a folder of the user's
    (repo / "snapshots" / ("f" * 40)).symlink_to(outside)
    assert cache_dir() == hub_cache
    listed = cli("list")
    assert "hostile:q4_0" in listed.output, listed.output
    result = cli("rm", "--yes", "hostile:q4_0")
    assert result.exit_code == 0, result.output
    assert precious.read_bytes() == MODEL
    assert (outside / "model.Q4_0.gguf").read_bytes() == b"the user's own file"
    assert not repo.exists()  # the repo folder (its links) went
    assert "hostile" not in cli("list").output


def test_rm_of_a_repo_folder_that_is_a_link_removes_the_link(cli, hub_cache, tmp_path):
    precious = tmp_path / "precious.gguf"
    precious.write_bytes(MODEL)
    real = _cached_repo(tmp_path / "elsewhere", {"model.Q4_0.gguf": precious})
    hub_cache.mkdir(parents=True, exist_ok=True)
    link = storage_dir(hub_cache, REPO)
    link.symlink_to(real)
    result = cli("rm", "--yes", "hostile:q4_0")
    assert result.exit_code == 0, result.output
    assert not link.exists() and not link.is_symlink()
    assert (real / "snapshots" / GOOD_COMMIT / "model.Q4_0.gguf").exists()
