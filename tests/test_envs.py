"""localchat/envs.py is the one place LOCALCHAT_* settings are named and read: every name used in
localchat/ is one of its settings, no other module reads one from os.environ, each setting reads
the environment when asked, and docs/settings.md lists them all."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

from localchat import envs

ROOT = Path(envs.__file__).parent
NAME = re.compile(r"\bLOCALCHAT_[A-Z0-9_]+")
# Modules that may still read a LOCALCHAT_* variable themselves: none (the tensor- and data-parallel
# ones read envs.TP_* and envs.DP_*). Nothing may join this list.
PENDING: set[str] = set()


def _sources() -> list[Path]:
    return [p for p in sorted(ROOT.rglob("*")) if p.suffix in (".py", ".h", ".cpp")]


def _is_environ(node: ast.AST) -> bool:
    return (
        isinstance(node, ast.Attribute)
        and node.attr == "environ"
        and isinstance(node.value, ast.Name)
        and node.value.id == "os"
    )


def _keys_read(tree: ast.Module) -> list[tuple[int, ast.expr]]:
    """Each (line, key expression) the module looks up in the environment: os.environ[...],
    os.environ.get/pop/setdefault(...), os.getenv(...), `... in os.environ`."""
    found: list[tuple[int, ast.expr]] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Subscript) and _is_environ(node.value):
            found.append((node.lineno, node.slice))
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            method = isinstance(func, ast.Attribute) and _is_environ(func.value)
            getenv = isinstance(func, ast.Attribute) and func.attr == "getenv"
            if method or getenv:
                found.append((node.lineno, node.args[0]))
        elif isinstance(node, ast.Compare) and any(_is_environ(c) for c in node.comparators):
            found.append((node.lineno, node.left))
    return found


def _constants(tree: ast.Module) -> dict[str, str]:
    """The module's NAME = "text" assignments."""
    out = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant):
            for target in node.targets:
                if isinstance(target, ast.Name) and isinstance(node.value.value, str):
                    out[target.id] = node.value.value
    return out


def test_every_name_used_in_localchat_is_a_setting():
    known = {s.name for s in envs.SETTINGS}
    used = {name for path in _sources() for name in NAME.findall(path.read_text())}
    assert used - known == set()


def test_the_settings_are_all_listed_once():
    names = [s.name for s in envs.SETTINGS]
    declared = [v for v in vars(envs).values() if isinstance(v, envs.Setting)]
    assert len(names) == len(set(names)) == len(declared) >= 17
    assert all(NAME.fullmatch(s.name) and s.doc for s in envs.SETTINGS)


def test_no_other_module_reads_a_setting_from_the_environment():
    readers = []
    for path in ROOT.rglob("*.py"):
        if path == Path(envs.__file__) or path.name in PENDING:
            continue
        tree = ast.parse(path.read_text())
        constants = _constants(tree)
        for line, key in _keys_read(tree):
            text = key.value if isinstance(key, ast.Constant) else None
            if isinstance(key, ast.Name):
                text = constants.get(key.id)
            if isinstance(text, str) and text.startswith("LOCALCHAT_"):
                readers.append(f"{path.relative_to(ROOT.parent)}:{line} reads {text}")
    assert readers == []


def test_docs_list_every_setting():
    docs = (ROOT.parent / "docs" / "settings.md").read_text()
    assert [s.name for s in envs.SETTINGS if f"`{s.name}`" not in docs] == []


def test_settings_are_read_when_asked(monkeypatch):
    monkeypatch.delenv("LOCALCHAT_DENSE_MIN_ROWS", raising=False)
    assert envs.DENSE_MIN_ROWS.get() is None
    monkeypatch.setenv("LOCALCHAT_DENSE_MIN_ROWS", "32")
    assert envs.DENSE_MIN_ROWS.get() == 32
    monkeypatch.setenv("LOCALCHAT_DENSE_MIN_ROWS", "")  # empty: the default
    assert envs.DENSE_MIN_ROWS.get() is None
    monkeypatch.setenv("LOCALCHAT_TP_TIMEOUT", "2.5")
    assert envs.TP_TIMEOUT.get() == 2.5


@pytest.mark.parametrize(
    ("setting", "raw", "value"),
    [
        (envs.HUGE_PAGES, "0", False),
        (envs.HUGE_PAGES, "1", True),
        (envs.INT8_ACTIVATIONS, "0", False),
        (envs.INT8_ACTIVATIONS, "yes", True),
        (envs.NO_CPU_KERNELS, "0", True),  # any value turns them off
        (envs.REQUIRE_CPU_KERNELS, "true", False),  # only "1" requires them
        (envs.CACHE_DIR, "/tmp/x", "/tmp/x"),
    ],
)
def test_each_kind_parses_as_before(monkeypatch, setting, raw, value):
    monkeypatch.setenv(setting.name, raw)
    assert setting.get() == value


def test_a_bad_value_names_its_variable(monkeypatch):
    monkeypatch.setenv("LOCALCHAT_CPU_BLOCK_CACHE_MB", "lots")
    with pytest.raises(ValueError, match="LOCALCHAT_CPU_BLOCK_CACHE_MB='lots'"):
        envs.CPU_BLOCK_CACHE_MB.get()
