"""ModelInfo: the read-only facts about the model an engine serves, for the server, the TUI and the
bench."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import torch


@dataclass(frozen=True, slots=True)
class ModelInfo:
    """What was loaded and how. `source_kind` is 'gguf' or 'hf_dir' and `source_path` the file or
    directory the user named; `config_dir` is the Hugging Face style directory holding config.json
    and the tokenizer (for a GGUF source, the directory made from it). `vocab_size` is the model's
    (the LM head's rows)."""

    name: str
    source_kind: str
    source_path: Path
    config_dir: Path
    load_format: str
    vocab_size: int
    max_model_len: int
    dtype: torch.dtype
    device: str
    eos_token_ids: tuple[int, ...]
    family: str = ""  # the model family's name ("Gemma 3", "Qwen3-MoE"), from its architecture
    takes_images: bool = False  # a vision-language model whose image encoder is loaded
    # where its image processor and multimodal config are, when not in config_dir: for a GGUF
    # model, the directory made with its mmproj file (engine/loading/mmproj.py)
    processor_dir: Path | None = None

    @property
    def gguf_path(self) -> Path | None:
        return self.source_path if self.source_kind == "gguf" else None

    @property
    def generation_defaults(self):
        """The model's sampling defaults from its generation_config.json (a GenerationDefaults)."""
        from localchat.models.generation_defaults import defaults_for

        return defaults_for(self.source_kind, self.source_path)

    @property
    def dtype_name(self) -> str:
        return str(self.dtype).removeprefix("torch.")
