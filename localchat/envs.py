"""Every LOCALCHAT_* environment variable, with its type, default and meaning (docs/settings.md
lists them). Each is read when asked, `envs.CACHE_DIR.get()`, never at import, so a setting made
after start-up (a test's monkeypatch.setenv, a parent process's) holds. Unset or empty is the
default; a value that does not parse is a ValueError naming the variable."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Setting(Generic[T]):
    """One LOCALCHAT_* variable: `kind` says how its value reads, `doc` what it does."""

    name: str
    kind: str
    default: T
    doc: str
    parse: Callable[[str], T]

    def get(self) -> T:
        """The value now: the default when the variable is unset or empty."""
        raw = os.environ.get(self.name, "")
        if not raw:
            return self.default
        try:
            return self.parse(raw)
        except ValueError as exc:
            raise ValueError(f"{self.name}={raw!r}: expected {self.kind}") from exc

    def set(self, raw: str) -> None:
        """Write the variable for this process and the ones it starts (empty: unset it)."""
        if raw:
            os.environ[self.name] = raw
        else:
            os.environ.pop(self.name, None)


def _is_one(raw: str) -> bool:
    return raw == "1"


def _is_not_zero(raw: str) -> bool:
    return raw != "0"


def _is_set(raw: str) -> bool:
    return True


def _seconds(name: str, default: float, doc: str) -> Setting[float]:
    return Setting(name, "seconds", default, doc, float)


# --- where files go -------------------------------------------------------------------------------
CACHE_DIR: Setting[str | None] = Setting(
    "LOCALCHAT_CACHE_DIR",
    "path",
    None,
    "The cache (converted GGUF configs and tokenizers, aliases, bench files); default: the "
    "platform's user cache directory.",
    str,
)
DATA_DIR: Setting[str | None] = Setting(
    "LOCALCHAT_DATA_DIR",
    "path",
    None,
    "The chat's saved conversations; default: the platform's user data directory.",
    str,
)

# --- the API key ----------------------------------------------------------------------------------
API_KEY: Setting[str | None] = Setting(
    "LOCALCHAT_API_KEY",
    "text",
    None,
    "The Bearer key: the server requires it (--api-key), clients send it (chat --url, bench, ps).",
    str,
)

# --- the CPU kernels ------------------------------------------------------------------------------
NO_CPU_KERNELS: Setting[bool] = Setting(
    "LOCALCHAT_NO_CPU_KERNELS",
    "flag (any value)",
    False,
    "Never build or load the C++ CPU kernels: torch ops everywhere.",
    _is_set,
)
REQUIRE_CPU_KERNELS: Setting[bool] = Setting(
    "LOCALCHAT_REQUIRE_CPU_KERNELS",
    "1",
    False,
    "A failed build of the CPU kernels raises instead of falling back to torch ops (CI).",
    _is_one,
)
CPU_ISA: Setting[str | None] = Setting(
    "LOCALCHAT_CPU_ISA",
    "generic, avx2, avx512 or neon",
    None,
    "Build that ISA's CPU kernels only (generic: no vector kernels); default: this CPU's best.",
    str,
)
TRITON_ON_CPU: Setting[bool] = Setting(
    "LOCALCHAT_TRITON_ON_CPU",
    "1",
    False,
    "CPU tensors take the Triton kernels too, when TRITON_INTERPRET=1 (how the tests run them).",
    _is_one,
)
BF16_GEMM_MIN_ROWS: Setting[int | None] = Setting(
    "LOCALCHAT_BF16_GEMM_MIN_ROWS",
    "rows (0: never)",
    None,
    "From this many rows a large quantized projection runs as bfloat16 GEMMs; default: 64 where "
    "the CPU has bfloat16 instructions, else never.",
    int,
)
DENSE_MIN_ROWS: Setting[int | None] = Setting(
    "LOCALCHAT_DENSE_MIN_ROWS",
    "rows (0: never)",
    None,
    "From this many rows a quantized weight is dequantized for one float32 GEMM; default: never, "
    "so a row's result does not depend on its batch (with 128, a small model's long prompt "
    "prefills about 1.5x faster on an AVX2 CPU without VNNI).",
    int,
)
INT8_ACTIVATIONS: Setting[bool | None] = Setting(
    "LOCALCHAT_INT8_ACTIVATIONS",
    "1 or 0",
    None,
    "1: activations take one int8 code everywhere, 0: two everywhere; default: two below 2048 "
    "inputs, one from there.",
    _is_not_zero,
)

# --- memory ---------------------------------------------------------------------------------------
CPU_BLOCK_CACHE_MB: Setting[int | None] = Setting(
    "LOCALCHAT_CPU_BLOCK_CACHE_MB",
    "MiB (0: off)",
    None,
    "The C++ kernels' cache of freed CPU blocks; default: 16 times a step's largest activation, "
    "32 to 512 MiB.",
    int,
)
HUGE_PAGES: Setting[bool | None] = Setting(
    "LOCALCHAT_HUGE_PAGES",
    "1 or 0",
    None,
    "Ask for transparent huge pages for the KV pool and packed weights; default: yes, except in a "
    "VM whose memory balloon reports free pages.",
    _is_not_zero,
)

# --- the server's connections (docs/security.md) --------------------------------------------------
HEADER_TIMEOUT = _seconds(
    "LOCALCHAT_HEADER_TIMEOUT",
    10.0,
    "serve's --header-timeout: seconds a client has to send a request's line and headers.",
)
BODY_TIMEOUT = _seconds(
    "LOCALCHAT_BODY_TIMEOUT",
    60.0,
    "serve's --body-timeout: seconds a client has to send a request's body (then 408).",
)
MEDIA_FETCH_TIMEOUT = _seconds(
    "LOCALCHAT_MEDIA_FETCH_TIMEOUT",
    10.0,
    "Most seconds fetching one image URL of --allowed-media-domains may take, redirects included "
    "(then 400).",
)

# --- what one request may carry (engine/sampling/request_limits.py) -------------------------------
LIMITS: Setting[str] = Setting(
    "LOCALCHAT_LIMITS",
    "NAME=VALUE list",
    "",
    "Bounds on what one request may carry, comma-separated (serve --limit writes it): stop "
    "strings, tools, grammars, prompts, embeddings inputs, JSON depth; docs/security.md lists "
    "the names and defaults.",
    str,
)

# --- several processes ----------------------------------------------------------------------------
TP_TIMEOUT = _seconds(
    "LOCALCHAT_TP_TIMEOUT", 120.0, "Most a tensor-parallel collective (or the rendezvous) may take."
)
TP_PING_TIMEOUT = _seconds(
    "LOCALCHAT_TP_PING_TIMEOUT",
    10.0,
    "Most an idle tensor-parallel rank may take to answer a health ping.",
)
TP_LOAD_TIMEOUT = _seconds(
    "LOCALCHAT_TP_LOAD_TIMEOUT",
    600.0,
    "Most a tensor-parallel rank may take to load its shard; under torchrun also the longest an "
    "idle rank waits for rank 0's next command.",
)
DP_TIMEOUT = _seconds(
    "LOCALCHAT_DP_TIMEOUT",
    120.0,
    "Most a data-parallel replica may go without a word before it counts as hung.",
)
DP_LOAD_TIMEOUT = _seconds(
    "LOCALCHAT_DP_LOAD_TIMEOUT", 600.0, "Most the data-parallel replicas may take to load."
)
DP_RESTARTS: Setting[int] = Setting(
    "LOCALCHAT_DP_RESTARTS",
    "count",
    3,
    "Most times a failed data-parallel replica is started again within 10 minutes (0: never).",
    int,
)

# every setting above, in this order
SETTINGS: tuple[Setting[Any], ...] = tuple(
    v for v in dict(globals()).values() if isinstance(v, Setting)
)
