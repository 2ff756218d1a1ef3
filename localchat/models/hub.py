"""Where the hub is and how to reach it: HF_ENDPOINT, HF_TOKEN and the hub cache directory, read
when called (huggingface_hub reads them once, at import), and a fast reachability probe."""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from urllib.parse import urlparse

from localchat.errors import ModelDownloadError

DEFAULT_ENDPOINT = "https://huggingface.co"
PROBE_TIMEOUT_S = 3.0


def endpoint() -> str:
    """The hub's base URL: HF_ENDPOINT (a mirror) or huggingface.co."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def token() -> str | None:
    """HF_TOKEN (for private or gated repos), or None: huggingface_hub then uses a stored login."""
    return os.environ.get("HF_TOKEN") or None


def cache_dir() -> Path:
    """The user's Hugging Face hub cache: HF_HUB_CACHE, else HF_HOME/hub, else
    ~/.cache/huggingface/hub."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache"), "huggingface"
    )
    return Path(home).expanduser() / "hub"


def offline() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in ("1", "true", "yes", "on")


def require_reachable(url: str | None = None, timeout: float = PROBE_TIMEOUT_S) -> None:
    """Raise ModelDownloadError within about `timeout` seconds when the hub at `url` cannot be
    reached (no DNS, refused, firewalled), instead of letting a download hang or retry."""
    url = url or endpoint()
    if offline():
        raise ModelDownloadError(
            "HF_HUB_OFFLINE is set, so the hub is not contacted; unset it to pull models"
        )
    parsed = urlparse(url)
    host = parsed.hostname
    if not host or parsed.scheme not in ("http", "https"):
        raise ModelDownloadError(f"HF_ENDPOINT {url!r} is not an http(s) URL")
    port = parsed.port or (443 if parsed.scheme == "https" else 80)
    problem = probe(host, port, timeout)
    if problem is not None:
        raise ModelDownloadError(
            f"cannot reach the model hub at {url} ({problem}). Check the network or proxy, set "
            "HF_ENDPOINT to a reachable mirror, or pass a local model directory or .gguf file"
        )


def probe(host: str, port: int, timeout: float = PROBE_TIMEOUT_S) -> str | None:
    """None when a TCP connection opens within `timeout` (DNS included), else what went wrong."""
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(exc.strerror or str(exc) or type(exc).__name__)

    thread = threading.Thread(target=connect, daemon=True)
    thread.start()
    thread.join(timeout)
    return outcome[0] if outcome else f"no answer within {timeout:.0f} s"
