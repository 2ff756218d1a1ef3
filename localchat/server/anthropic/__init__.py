"""Anthropic's Messages API (`POST /v1/messages`, `POST /v1/messages/count_tokens`) on the chat
path: requests become chat completions (`translate.py`), replies become content blocks and
Anthropic's server-sent events (`reply.py`), errors Anthropic's error shape (`errors.py`)."""
