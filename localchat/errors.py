"""Errors that reach users: each names the problem, and maps to an HTTP status and a CLI message."""

from __future__ import annotations


class LocalchatError(Exception):
    """Base class: a problem the user can fix, reported without a traceback.

    `http_status`, `error_type` and `param` shape the OpenAI-style error body the server returns.
    """

    http_status = 400
    error_type = "invalid_request_error"

    def __init__(self, message: str, *, param: str | None = None):
        super().__init__(message)
        self.message = message
        self.param = param


class InvalidParameterError(LocalchatError):
    """A configuration or sampling value outside its allowed range."""


class PromptTooLongError(LocalchatError):
    """The prompt (plus the requested new tokens) does not fit in the model's context."""


class EmptyPromptError(LocalchatError):
    """A prompt with no tokens."""


class ModelNotFoundError(LocalchatError):
    """A model path or name that cannot be found locally (and cannot be downloaded)."""

    http_status = 404
    error_type = "not_found_error"


class UnsupportedModelError(LocalchatError):
    """A model whose architecture has no forward pass here."""


class InvalidModelFileError(LocalchatError):
    """A model file that cannot be read: not GGUF, cut off, or inconsistent with its own tensor
    table."""


class ModelDownloadError(LocalchatError):
    """Fetching a model failed (no network, pip failure, hub unreachable)."""

    http_status = 503
    error_type = "service_unavailable"


class NoTokenizerError(LocalchatError):
    """Text was given to a model loaded without a tokenizer (e.g. a dummy config)."""


class EngineDeadError(LocalchatError):
    """The engine thread stopped; no request can be served."""

    http_status = 503
    error_type = "service_unavailable"


class EngineStepError(LocalchatError):
    """An engine step failed (out of memory, a kernel error): the requests it ran end with this,
    the engine serves on. `request_ids` names them."""

    http_status = 500
    error_type = "server_error"

    def __init__(self, message: str, request_ids: tuple[str, ...] = ()):
        super().__init__(message)
        self.request_ids = request_ids


class QueueFullError(LocalchatError):
    """Too many requests are waiting; retry later."""

    http_status = 503
    error_type = "service_unavailable"
