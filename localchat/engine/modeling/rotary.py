"""Rotary embedding tables: cos/sin by position for each of a model's rotary tables.

A model has one table ("default"), or one per layer type where its config gives rotary parameters
per type (Gemma 3: "sliding_attention" and "full_attention"). The inverse frequencies of every
scaled type (linear, llama3, yarn, longrope, dynamic NTK) come from transformers' own
ROPE_INIT_FUNCTIONS, so our tables equal its; the plain one is the same expression. Two types depend
on the sequence's length, as in transformers: longrope takes its long factors once a sequence is
longer than the pretraining context, and dynamic NTK stretches its base by the sequence's length
past it. Those are looked up per token from its sequence's length in this step
(`lookup(..., seq_lens)`).
"""

from __future__ import annotations

import copy
import functools

import torch

from localchat.errors import UnsupportedModelError

# the types whose frequencies depend on the sequence's length
_DYNAMIC_TYPES = ("dynamic", "longrope")


def rope_parameters_by_key(config) -> dict[str, dict]:
    """{table key: its rotary parameters (rope_type, rope_theta, ...)}: one "default" table, or one
    per layer type when the config nests its parameters by layer type."""
    config = copy.copy(config)  # standardize_rope_params writes into the config
    if not getattr(config, "rope_parameters", None) and getattr(config, "rope_scaling", None):
        config.rope_parameters = dict(config.rope_scaling)
    if hasattr(config, "standardize_rope_params"):
        config.standardize_rope_params()
    params = getattr(config, "rope_parameters", None) or {}
    nested = {k: v for k, v in params.items() if isinstance(v, dict)}
    if nested:
        return {key: _with_defaults(value, config) for key, value in nested.items()}
    return {"default": _with_defaults(params, config)}


def _with_defaults(params: dict, config) -> dict:
    params = dict(params)
    params.setdefault("rope_type", params.get("type", "default"))
    params.setdefault("rope_theta", getattr(config, "rope_theta", None) or 10000.0)
    if "partial_rotary_factor" not in params and hasattr(config, "partial_rotary_factor"):
        params["partial_rotary_factor"] = config.partial_rotary_factor
    return params


def rotary_dim(params: dict, head_dim: int) -> int:
    return int(head_dim * (params.get("partial_rotary_factor") or 1.0))


def _default_inv_freq(dim: int, theta: float) -> torch.Tensor:
    exponents = torch.arange(0, dim, 2, dtype=torch.int64).to(dtype=torch.float) / dim
    return 1.0 / (theta**exponents)


def llama3_divisors(dim: int, theta: float, params: dict) -> torch.Tensor:
    """What llama3 scaling divides each rotary pair's frequency by (llama.cpp's rope_freqs)."""
    from transformers import LlamaConfig

    config = LlamaConfig(
        hidden_size=dim,
        num_attention_heads=1,
        head_dim=dim,
        rope_parameters={"rope_theta": theta, **params},
    )
    scaled, _ = _init_function("llama3")(config, None)
    return _default_inv_freq(dim, theta) / scaled.float()


def _init_function(rope_type: str):
    from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

    if rope_type not in ROPE_INIT_FUNCTIONS:
        supported = ", ".join(["default", *sorted(ROPE_INIT_FUNCTIONS)])
        raise UnsupportedModelError(
            f"rope scaling {rope_type!r} is not supported (supported: {supported})"
        )
    return ROPE_INIT_FUNCTIONS[rope_type]


class RotaryTable:
    """cos/sin (float32, [positions, rotary_dim // 2]) of one rotary table, times its attention
    factor (yarn's and longrope's mscale), for every position up to max_positions."""

    def __init__(self, config, key: str, params: dict, head_dim: int, max_positions: int, device):
        self.config = config
        self.layer_type = None if key == "default" else key
        self.rope_type = params["rope_type"]
        self.dim = rotary_dim(params, head_dim)
        self.positions = torch.arange(max_positions, dtype=torch.int64).float()
        self.device = device
        self.original_max = int(
            params.get("original_max_position_embeddings")
            or getattr(config, "max_position_embeddings", None)
            or max_positions
        )
        if self.rope_type == "default":
            inv_freq, factor = _default_inv_freq(self.dim, float(params["rope_theta"])), 1.0
        else:
            inv_freq, factor = self._init(None)
        self.cos, self.sin = self._cos_sin(self.positions, inv_freq, factor)
        self.long: tuple[torch.Tensor, torch.Tensor] | None = None
        if self.rope_type == "longrope":
            self.long = self._cos_sin(self.positions, *self._init(self.original_max + 1))

    @property
    def depends_on_length(self) -> bool:
        return self.rope_type in _DYNAMIC_TYPES

    def _init(self, seq_len: int | None) -> tuple[torch.Tensor, float]:
        kwargs = {} if self.layer_type is None else {"layer_type": self.layer_type}
        config = copy.copy(self.config)  # the init functions standardize the config in place
        inv_freq, factor = _init_function(self.rope_type)(config, None, seq_len=seq_len, **kwargs)
        return inv_freq.float().cpu(), float(factor)

    def _cos_sin(self, positions: torch.Tensor, inv_freq: torch.Tensor, factor: float):
        freqs = positions[:, None] * inv_freq[None, :]
        cos, sin = freqs.cos(), freqs.sin()
        if factor != 1.0:
            cos, sin = cos * factor, sin * factor
        return cos.to(self.device), sin.to(self.device)

    def kv_salt(self, length: int) -> object | None:
        """What sets apart the keys of a sequence of `length` tokens from a shorter one's (None:
        nothing): longrope's long factors, or dynamic NTK's base for that length."""
        if not self.depends_on_length or length <= self.original_max:
            return None
        return "longrope" if self.long is not None else ("dynamic", length)

    @functools.lru_cache(maxsize=64)  # noqa: B019 - one table per model, a few lengths each
    def _dynamic_inv_freq(self, seq_len: int) -> tuple[torch.Tensor, float]:
        return self._init(seq_len)

    def lookup(
        self, positions: torch.Tensor, seq_lens: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos/sin of each token's position; `seq_lens` (each token's sequence length in this step,
        on the CPU) picks the length-dependent tables."""
        cos, sin = self.cos[positions], self.sin[positions]
        if not self.depends_on_length or seq_lens is None:
            return cos, sin
        beyond = seq_lens > self.original_max
        if not bool(beyond.any()):
            return cos, sin
        if self.long is not None:  # longrope: the long factors for those sequences' tokens
            mask = beyond.to(cos.device)[:, None]
            return (
                torch.where(mask, self.long[0][positions], cos),
                torch.where(mask, self.long[1][positions], sin),
            )
        cos, sin = cos.clone(), sin.clone()  # dynamic NTK: a base for each sequence length
        for length in torch.unique(seq_lens[beyond]).tolist():
            rows = (seq_lens == length).nonzero().flatten()
            row_positions = positions.cpu()[rows].float()
            row_cos, row_sin = self._cos_sin(row_positions, *self._dynamic_inv_freq(int(length)))
            cos[rows.to(cos.device)], sin[rows.to(cos.device)] = row_cos, row_sin
        return cos, sin


class RotaryTables:
    """A model's rotary tables by key (see `rope_parameters_by_key`), and the per-step lookup of
    all of them."""

    def __init__(self, config, head_dim: int, max_positions: int, device):
        self.tables = {
            key: RotaryTable(config, key, params, head_dim, max_positions, device)
            for key, params in rope_parameters_by_key(config).items()
        }
        if "default" not in self.tables:  # the fused CPU paths read one table: the first
            self.tables["default"] = next(iter(self.tables.values()))

    @property
    def depends_on_length(self) -> bool:
        """Whether a lookup needs each token's sequence length (not capturable in a CUDA graph)."""
        return any(table.depends_on_length for table in self.tables.values())

    @property
    def recomputes_on_switch(self) -> bool:
        """Whether a sequence's keys are computed again once it outgrows the pretraining context:
        transformers drops Phi-3's cache there, so that longrope's long factors rotate every key."""
        return any(table.long is not None for table in self.tables.values())

    def kv_salt(self, length: int) -> object | None:
        """What the keys of a sequence of `length` tokens depend on beyond its tokens (None where
        nothing does): the prefix cache shares blocks only between sequences with the same salt."""
        salts = tuple(table.kv_salt(length) for table in self.tables.values())
        return None if all(salt is None for salt in salts) else salts

    def lookup(
        self, positions: torch.Tensor, seq_lens: torch.Tensor | None = None
    ) -> dict[str, tuple[torch.Tensor, torch.Tensor]]:
        return {key: table.lookup(positions, seq_lens) for key, table in self.tables.items()}
