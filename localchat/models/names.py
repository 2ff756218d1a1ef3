"""Model names: `REPO[:FILE_OR_QUANT]` references to the hub, quantization tags found in GGUF file
names, and the short, stable registry names (`qwen2.5-0.5b-instruct:q4_k_m`)."""

from __future__ import annotations

import re
from dataclasses import dataclass

from localchat.errors import InvalidParameterError

# The quantization tag at the end of a GGUF file name: Q4_K_M, IQ3_XXS, Q8_0, F16, BF16, ...
_QUANT_RE = re.compile(r"(?:^|[-._])((?:i?q\d+(?:_[a-z0-9]+)*)|bf16|f16|f32)$", re.IGNORECASE)
_SPLIT_RE = re.compile(r"-\d{5}-of-\d{5}$")
_NAME_RE = re.compile(r"^[a-z0-9][a-z0-9._-]*(/[a-z0-9][a-z0-9._-]*)?(:[a-z0-9][a-z0-9._-]*)?$")
_REPO_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*$")


@dataclass(frozen=True)
class HubRef:
    """A model on the hub: `repo_id`, and optionally a GGUF file name or quantization tag."""

    repo_id: str
    spec: str | None = None

    def __str__(self) -> str:
        return self.repo_id if self.spec is None else f"{self.repo_id}:{self.spec}"


def looks_like_hub_ref(text: str) -> bool:
    """Whether `text` has the shape `owner/name[:spec]` (it may still not exist)."""
    repo, _, _ = text.partition(":")
    return bool(_REPO_RE.match(repo)) and not text.startswith((".", "/", "~"))


def parse_hub_ref(text: str) -> HubRef:
    """`Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m` -> HubRef(repo, 'q4_k_m'); a bad shape is an
    error naming the expected one."""
    repo, sep, spec = text.strip().partition(":")
    if not _REPO_RE.match(repo) or (sep and not spec):
        raise InvalidParameterError(
            f"{text!r} is not a hub model reference; expected OWNER/NAME or OWNER/NAME:QUANT "
            "(e.g. Qwen/Qwen2.5-0.5B-Instruct-GGUF:q4_k_m) or OWNER/NAME:FILE.gguf",
            param="model",
        )
    return HubRef(repo, spec or None)


def quant_of_filename(filename: str) -> str | None:
    """The quantization tag of a GGUF file name, lower case (`...-Q4_K_M.gguf` -> 'q4_k_m')."""
    stem = filename.rsplit("/", 1)[-1]
    stem = stem[: -len(".gguf")] if stem.lower().endswith(".gguf") else stem
    match = _QUANT_RE.search(_SPLIT_RE.sub("", stem))
    return match.group(1).lower() if match else None


def is_split_gguf(filename: str) -> bool:
    """Whether the file is one part of a split GGUF (`...-00001-of-00003.gguf`)."""
    return bool(_SPLIT_RE.search(filename.rsplit("/", 1)[-1].removesuffix(".gguf")))


def base_name(repo_id: str) -> str:
    """The short name of a repo: its name, lower case, without a `-GGUF` suffix."""
    name = repo_id.rsplit("/", 1)[-1].lower()
    return re.sub(r"[-_.]gguf$", "", name)


def model_name(repo_id: str, quant: str | None, *, namespaced: bool = False) -> str:
    """`qwen2.5-0.5b-instruct:q4_k_m`; with `namespaced`, `qwen/qwen2.5-0.5b-instruct:q4_k_m`
    (when two repos would share the short name)."""
    name = base_name(repo_id)
    if namespaced:
        name = f"{repo_id.split('/', 1)[0].lower()}/{name}"
    return name if quant is None else f"{name}:{quant.lower()}"


def check_alias_name(name: str) -> str:
    """An alias is a registry name: lower case letters, digits, `.`, `_`, `-`, an optional
    `:tag`."""
    if not _NAME_RE.match(name) or "/" in name:
        raise InvalidParameterError(
            f"{name!r} is not a valid model name: use lower case letters, digits, '.', '_' and "
            "'-', with an optional ':tag' (e.g. my-model:q4)",
            param="name",
        )
    return name


def is_mmproj(filename: str) -> bool:
    """Whether a GGUF file is llama.cpp's image encoder of a model (`mmproj*.gguf`), not a model
    of its own."""
    name = filename.rsplit("/", 1)[-1].lower()
    return name.startswith("mmproj") and name.endswith(".gguf")


# the mmproj precisions taken when none matches the text model's, best first
_MMPROJ_FALLBACKS = ("f16", "bf16", "f32", "q8_0")


def choose_mmproj(names: list[str], model_file: str) -> str | None:
    """The image encoder (`mmproj*.gguf`) among `names` to go with the GGUF file `model_file`: the
    only one, else the one of the model's precision (its quantization tag), else the f16 one (bf16,
    f32, q8_0 after it); None where there is none, or no rule picks one."""
    found = sorted(n for n in names if is_mmproj(n))
    if len(found) <= 1:
        return found[0] if found else None
    for wanted in (quant_of_filename(model_file), *_MMPROJ_FALLBACKS):
        matches = [n for n in found if wanted and quant_of_filename(n) == wanted]
        if len(matches) == 1:
            return matches[0]
    return None
