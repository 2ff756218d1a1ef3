"""What `localchat show NAME` reports: the facts, the generation defaults, the chat template and
the config (config.json, or a GGUF file's metadata)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from localchat.models.facts import facts_of, read_config
from localchat.models.generation_defaults import defaults_for, generation_config_path
from localchat.models.gguf_header import read_header
from localchat.models.registry import Entry


def describe(entry: Entry) -> dict[str, Any]:
    """Everything `show` prints, as JSON-ready data."""
    facts = facts_of(entry.kind, entry.path)
    config, template = _config_and_template(entry)
    return {
        **summary(entry),
        "architecture": facts.architecture,
        "family": facts.family,
        "parameters": facts.parameters,
        "context_length": facts.context_length,
        "generation_defaults": defaults_for(entry.kind, entry.path).as_dict(),
        "generation_config": str(generation_config_path(entry.kind, entry.path)),
        "chat_template": template,
        "config": config,
    }


def summary(entry: Entry) -> dict[str, Any]:
    """The fields of one `list --json` object."""
    facts = facts_of(entry.kind, entry.path)
    return {
        "name": entry.name,
        "source": entry.source,
        "format": entry.format,
        "quantization": facts.quantization,
        "size_bytes": facts.size_bytes,
        "architecture": facts.architecture,
        "family": facts.family,
        "family_label": facts.family_label,
        "parameters": facts.parameters,
        "context_length": facts.context_length,
        "path": str(entry.path),
        "origin": entry.origin,
    }


def _config_and_template(entry: Entry) -> tuple[dict[str, Any], str | None]:
    if entry.kind == "gguf":
        metadata = read_header(entry.path).metadata
        template = metadata.get("tokenizer.chat_template")
        config = {k: v for k, v in metadata.items() if not k.startswith("tokenizer.chat_template")}
        return config, template
    return read_config(entry.path), _dir_template(entry.path)


def _dir_template(directory: Path) -> str | None:
    jinja = directory / "chat_template.jinja"
    if jinja.is_file():
        return jinja.read_text()
    try:
        template = json.loads((directory / "tokenizer_config.json").read_text()).get(
            "chat_template"
        )
    except (OSError, ValueError, AttributeError):
        return None
    if isinstance(template, list):  # named templates: the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default")
    return template if isinstance(template, str) else None
