"""SpeculativeConfig: which drafting method, and how many tokens it may draft, as vLLM's
`--speculative-config` takes them (a JSON object)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from localchat.errors import InvalidParameterError

PARAM = "speculative_config"
METHODS = ("ngram", "suffix", "draft_model")
# methods vLLM names that have no drafter here yet: refused by name rather than ignored
NOT_YET = ("eagle", "eagle3", "medusa", "mlp_speculator", "mtp", "deepseek_mtp")
# the draft_model method's own fields: its model, and how it is loaded (as EngineConfig's options;
# `quantization` is vLLM's field, `load_format` ours, "dummy" giving it random weights)
DRAFT_FIELDS = ("model", "quantization", "load_format")
QUANTIZATIONS = ("auto", "none", "int8", "int4")  # as localchat.config's (which imports this)
LOAD_FORMATS = ("auto", "dummy")
MAX_SPECULATIVE_TOKENS = 16
SUFFIX_FIELDS = (
    "suffix_decoding_max_tree_depth",
    "suffix_decoding_max_cached_requests",
    "suffix_decoding_max_spec_factor",
    "suffix_decoding_min_token_prob",
)
MAX_LOOKUP = 32


def config_error(message: str, field: str | None = None) -> InvalidParameterError:
    where = f"{PARAM}.{field}" if field else PARAM
    return InvalidParameterError(f"{where}: {message}", param=PARAM)


@dataclass(frozen=True, slots=True)
class SpeculativeConfig:
    """`ngram` (prompt lookup): the longest n-gram in [prompt_lookup_min, prompt_lookup_max] that
    ends the sequence is looked up in its earlier tokens (prompt and output), and the tokens that
    followed an earlier occurrence are the draft, at most num_speculative_tokens of them (ngram.py).
    `suffix`: the most frequent continuation of the sequence's longest suffix in a suffix tree of
    depth suffix_decoding_max_tree_depth over its own tokens and over the outputs of the last
    suffix_decoding_max_cached_requests requests, while each token keeps
    suffix_decoding_min_token_prob of the paths, for at most max_spec_factor times the match's
    length (suffix.py). `draft_model`: a small model with the same tokenizer (`model`, loaded as the
    main model is, with `quantization` and `load_format` as EngineConfig takes them) drafts
    greedily, with a paged KV cache of its own (draft_model.py). With `adaptive` (the default),
    each sequence's draft length also follows its acceptance (draft_length.py)."""

    method: str = "ngram"
    num_speculative_tokens: int = 5
    prompt_lookup_min: int = 2
    prompt_lookup_max: int = 4
    adaptive: bool = True
    # suffix (suffix.py), under vLLM's names
    suffix_decoding_max_tree_depth: int = 24
    suffix_decoding_max_cached_requests: int = 16
    suffix_decoding_max_spec_factor: float = 1.0
    suffix_decoding_min_token_prob: float = 0.1
    # draft_model (draft_model.py)
    model: str | None = None
    quantization: str = "auto"
    load_format: str = "auto"

    @classmethod
    def parse(
        cls, value: SpeculativeConfig | dict[str, Any] | str | None
    ) -> SpeculativeConfig | None:
        """A config from a dict or its JSON text (None or "off": no speculation); raises
        InvalidParameterError naming the field that is wrong."""
        if value is None or isinstance(value, SpeculativeConfig):
            return value
        if isinstance(value, str):
            if value.strip().lower() in ("", "off", "none", "null"):
                return None
            try:
                value = json.loads(value)
            except json.JSONDecodeError as exc:
                raise config_error(
                    f"is not valid JSON ({exc.msg} at character {exc.pos})"
                ) from None
            if value is None:
                return None
        if not isinstance(value, dict):
            raise config_error('must be a JSON object such as {"method": "ngram"}')
        known = {
            "method",
            "num_speculative_tokens",
            "prompt_lookup_min",
            "prompt_lookup_max",
            "adaptive",
            *SUFFIX_FIELDS,
            *DRAFT_FIELDS,
        }
        unknown = sorted(set(value) - known)
        if unknown:
            raise config_error(f"unknown field; known: {', '.join(sorted(known))}", unknown[0])
        # vLLM: a model without a method is a draft model
        method = value.get("method", "draft_model" if "model" in value else "ngram")
        if method in NOT_YET:
            raise config_error(
                f"method {method!r} is not supported yet; supported: {', '.join(METHODS)}", "method"
            )
        if method not in METHODS:
            raise config_error(
                f"method must be one of {', '.join(METHODS)}, got {method!r}", "method"
            )
        k = _integer(
            value,
            "num_speculative_tokens",
            8 if method == "suffix" else 5,
            1,
            MAX_SPECULATIVE_TOKENS,
        )
        high = value.get("prompt_lookup_max")
        low = value.get("prompt_lookup_min")
        # vLLM: either bound alone sets both
        lookup_max = _integer(
            value, "prompt_lookup_max", low if high is None and low else 4, 1, MAX_LOOKUP
        )
        lookup_min = _integer(
            value, "prompt_lookup_min", min(2, lookup_max) if low is None else low, 1, MAX_LOOKUP
        )
        if lookup_min > lookup_max:
            raise config_error(
                f"must not exceed prompt_lookup_max ({lookup_max}), got {lookup_min}",
                "prompt_lookup_min",
            )
        adaptive = value.get("adaptive", True)
        if not isinstance(adaptive, bool):
            raise config_error(f"must be true or false, got {adaptive!r}", "adaptive")
        depth = _integer(value, "suffix_decoding_max_tree_depth", 24, 2, 64)
        cached = _integer(value, "suffix_decoding_max_cached_requests", 16, 0, 1000)
        factor = _number(value, "suffix_decoding_max_spec_factor", 1.0, 0.1, 16.0)
        min_prob = _number(value, "suffix_decoding_min_token_prob", 0.1, 0.0, 1.0)
        if method != "suffix" and set(value) & set(SUFFIX_FIELDS):
            field = sorted(set(value) & set(SUFFIX_FIELDS))[0]
            raise config_error("is for method suffix", field)
        model, quantization, load_format = _draft_fields(value, method)
        return cls(
            method,
            k,
            lookup_min,
            lookup_max,
            adaptive,
            depth,
            cached,
            factor,
            min_prob,
            model,
            quantization,
            load_format,
        )

    def to_dict(self) -> dict[str, Any]:
        fields = {
            "method": self.method,
            "num_speculative_tokens": self.num_speculative_tokens,
            "adaptive": self.adaptive,
        }
        if self.method == "ngram":
            fields["prompt_lookup_min"] = self.prompt_lookup_min
            fields["prompt_lookup_max"] = self.prompt_lookup_max
        elif self.method == "suffix":
            fields.update({name: getattr(self, name) for name in SUFFIX_FIELDS})
        else:
            fields.update({name: getattr(self, name) for name in DRAFT_FIELDS})
        return fields


def _draft_fields(value: dict[str, Any], method: str) -> tuple[str | None, str, str]:
    """The draft_model method's model, quantization and load format (refused for the others)."""
    if method != "draft_model":
        given = sorted(set(value) & set(DRAFT_FIELDS))
        if given:
            raise config_error("is for method draft_model", given[0])
        return None, "auto", "auto"
    model = value.get("model")
    if not isinstance(model, str) or not model.strip():
        raise config_error(
            "the draft model's name or path is required for method draft_model", "model"
        )
    quantization = value.get("quantization") or "auto"  # vLLM's null: as the file is
    if quantization not in QUANTIZATIONS:
        raise config_error(f"must be one of {QUANTIZATIONS}, got {quantization!r}", "quantization")
    load_format = value.get("load_format", "auto")
    if load_format not in LOAD_FORMATS:
        raise config_error(f"must be one of {LOAD_FORMATS}, got {load_format!r}", "load_format")
    return model, quantization, load_format


def _integer(value: dict[str, Any], field: str, default: Any, low: int, high: int) -> int:
    number = value.get(field, default)
    if isinstance(number, bool) or not isinstance(number, int):
        raise config_error(f"must be an integer, got {number!r}", field)
    if not low <= number <= high:
        raise config_error(f"must be in [{low}, {high}], got {number}", field)
    return number


def _number(value: dict[str, Any], field: str, default: float, low: float, high: float) -> float:
    number = value.get(field, default)
    if isinstance(number, bool) or not isinstance(number, int | float):
        raise config_error(f"must be a number, got {number!r}", field)
    if not low <= number <= high:
        raise config_error(f"must be in [{low}, {high}], got {number}", field)
    return float(number)
