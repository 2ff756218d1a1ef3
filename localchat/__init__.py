"""localchat: chat with and serve open LLMs on your own machine, on our own paged-KV engine."""

from localchat.config import EngineConfig
from localchat.errors import LocalchatError

__version__ = "0.1.0"
__all__ = [
    "LLM",
    "AsyncEngine",
    "EngineConfig",
    "LLMEngine",
    "LocalchatError",
    "SamplingParams",
    "__version__",
]


def __getattr__(name: str):
    # Heavy imports (torch, transformers) wait until the engine is actually used, so
    # `localchat --help` and the HTTP client stay fast.
    if name == "LLM":
        from localchat.engine.llm import LLM

        return LLM
    if name == "AsyncEngine":
        from localchat.engine.core.async_engine import AsyncEngine

        return AsyncEngine
    if name == "LLMEngine":
        from localchat.engine.core.llm_engine import LLMEngine

        return LLMEngine
    if name == "SamplingParams":
        from localchat.engine.sampling.sampling_params import SamplingParams

        return SamplingParams
    raise AttributeError(f"module 'localchat' has no attribute {name!r}")
