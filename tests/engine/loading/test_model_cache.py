"""The converted-GGUF cache (engine/loading/model_cache.py) and the loader's errors: an unsupported
GGUF architecture is named, a half-written directory is rebuilt rather than trusted, a conversion
killed mid-way leaves nothing that looks finished, and two processes preparing the same file at once
both get the same whole directory (real processes throughout)."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from localchat.engine.loading.model_cache import MANIFEST, ensure_converted, is_complete
from localchat.errors import UnsupportedModelError
from localchat.models.paths import converted_dir

ANNOUNCEMENT = "reading the tokenizer of"  # ensure_converted's line when it converts


@pytest.fixture(scope="module")
def reference(default_gguf, tmp_path_factory) -> dict[str, bytes]:
    """The files of an undisturbed conversion of the default model, by name."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("LOCALCHAT_CACHE_DIR", str(tmp_path_factory.mktemp("reference-cache")))
        return _files(ensure_converted(default_gguf))


def _files(directory: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(directory.iterdir())}


def _directories(cache_dir: Path) -> list[str]:
    """The directories in the cache's GGUF folder: converted ones and any staging left behind."""
    folder = cache_dir / "gguf"
    return sorted(p.name for p in folder.iterdir() if p.is_dir()) if folder.is_dir() else []


def _write_gguf(path: Path, arch: str) -> None:
    from gguf import GGUFWriter

    writer = GGUFWriter(str(path), arch)
    writer.add_block_count(1)
    writer.add_tensor("token_embd.weight", np.zeros((4, 8), dtype=np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def test_an_unsupported_gguf_architecture_is_named_and_leaves_no_directory(tmp_path, cache_dir):
    from localchat import LLM

    path = tmp_path / "gpt2.gguf"
    _write_gguf(path, "gpt2")
    message = r"gpt2\.gguf: GGUF architecture 'gpt2' is not supported; supported: llama, qwen2"
    with pytest.raises(UnsupportedModelError, match=message):
        LLM(str(path))
    assert _directories(cache_dir) == []


def test_the_cli_says_an_unsupported_architecture_in_one_line(tmp_path, cache_dir):
    path = tmp_path / "gpt2.gguf"
    _write_gguf(path, "gpt2")
    result = subprocess.run(
        [sys.executable, "-m", "localchat", "generate", "--model", str(path), "hello"],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 2, result.stderr
    assert "error: gpt2.gguf: GGUF architecture 'gpt2' is not supported" in result.stderr
    assert "Traceback" not in result.stderr + result.stdout


@pytest.mark.slow
@pytest.mark.parametrize("damage", ["no-manifest", "file-cut-short"])
def test_a_half_written_directory_is_rebuilt(default_gguf, cache_dir, reference, damage):
    target = converted_dir(default_gguf)
    target.mkdir(parents=True)
    if damage == "no-manifest":  # what a writer that died before its last file leaves
        (target / "config.json").write_text("{")
    else:  # finished once, then a file lost its tail (disk full, an interrupted copy)
        for name, data in reference.items():
            (target / name).write_bytes(data)
        (target / "tokenizer.json").write_bytes(reference["tokenizer.json"][:1000])
    staging = target.parent / f"{target.name}.k1ll3d"  # a staging directory of a killed process
    staging.mkdir()
    (staging / "config.json").write_text("{")
    assert not is_complete(target)

    assert ensure_converted(default_gguf) == target
    assert _files(target) == reference and MANIFEST in reference
    assert _directories(cache_dir) == [target.name]


@pytest.mark.slow
def test_a_conversion_killed_mid_way_is_not_trusted(default_gguf, cache_dir, reference):
    target = converted_dir(default_gguf)
    child = subprocess.Popen(
        [sys.executable, "-c", _CONVERT, str(default_gguf)],
        stderr=subprocess.DEVNULL,
    )
    try:
        # config.json is the first file written, the tokenizer (seconds) the last
        while not (cache_dir / "gguf").is_dir() or not any(
            (cache_dir / "gguf" / name / "config.json").is_file()
            for name in _directories(cache_dir)
        ):
            assert child.poll() is None, "the conversion ended before it could be killed"
            time.sleep(0.005)
    finally:
        child.kill()
        child.wait()
    assert not target.exists()  # the partial copy is in a staging directory, not in place
    (left_behind,) = _directories(cache_dir)

    assert ensure_converted(default_gguf) == target
    assert _files(target) == reference
    assert _directories(cache_dir) == [target.name] and left_behind != target.name


_CONVERT = """
import sys
from pathlib import Path
from localchat.engine.loading.model_cache import ensure_converted
print(ensure_converted(Path(sys.argv[1])))
"""
# Both children import first, then start together once the test sees them both ready.
_CONVERT_TOGETHER = """
import sys, time
from pathlib import Path
from localchat.engine.loading.model_cache import ensure_converted
Path(sys.argv[2]).touch()
while not Path(sys.argv[3]).exists():
    time.sleep(0.002)
print(ensure_converted(Path(sys.argv[1])))
"""


@pytest.mark.slow
def test_two_processes_preparing_one_file_both_succeed(
    default_gguf, cache_dir, reference, tmp_path
):
    go = tmp_path / "go"
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CONVERT_TOGETHER,
                str(default_gguf),
                str(tmp_path / f"ready{i}"),
                str(go),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"ready{i}").exists() for i in range(2)):
        assert time.monotonic() < deadline and all(c.poll() is None for c in children)
        time.sleep(0.01)
    go.touch()
    results = [(c.wait(timeout=300), *c.communicate()) for c in children]

    target = converted_dir(default_gguf)
    for returncode, stdout, stderr in results:
        assert returncode == 0, stderr
        assert Path(stdout.strip()) == target
    # one converted, the other waited for it and found it whole
    assert sum(ANNOUNCEMENT in stderr for _, _, stderr in results) == 1
    assert _files(target) == reference
    assert _directories(cache_dir) == [target.name]
