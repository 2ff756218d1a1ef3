"""One log line per HTTP request, written when its response is complete (streams included)."""

from __future__ import annotations

import logging
import time

logger = logging.getLogger("localchat.server")
# C0 controls, DEL and C1 controls (ESC starts terminal sequences, CR/LF start forged lines)
_CONTROL = {c: f"\\x{c:02x}" for c in (*range(32), ord('"'), *range(127, 160))}
_CONTROL[ord("\\")] = "\\\\"


def escape(text: str) -> str:
    """`text` with every control character and `"` written as \\xNN (a backslash as \\\\), so a
    request's path cannot forge a log line, end its quoted field or drive the terminal."""
    return text.translate(_CONTROL)


def access_log(app):
    """Wrap an ASGI app: `client "METHOD path" status seconds [prompt/completion/cached tokens]`."""

    async def middleware(scope, receive, send):
        if scope["type"] != "http":
            return await app(scope, receive, send)
        start = time.monotonic()
        status = 0

        async def send_with_status(message):
            nonlocal status
            if message["type"] == "http.response.start":
                status = message["status"]
            await send(message)

        try:
            await app(scope, receive, send_with_status)
        finally:
            client = scope.get("client")
            line = (
                f"{escape(client[0]) if client else '-'} "
                f'"{escape(scope["method"])} {escape(scope["path"])}" '
                f"{status or 'disconnected'} {time.monotonic() - start:.3f}s"
            )
            # set by streaming.start_generation as `request.state.localchat_generation`; Litestar's
            # request state lives in this same scope dict, under "state"
            generation = (scope.get("state") or {}).get("localchat_generation")
            if generation is not None:
                usage = generation.usage()
                line += (
                    f" prompt={usage['prompt_tokens']} completion={usage['completion_tokens']}"
                    f" cached={usage['prompt_tokens_details']['cached_tokens']}"
                )
                if generation.aborted:
                    line += " aborted"
            logger.info(line)

    return middleware
