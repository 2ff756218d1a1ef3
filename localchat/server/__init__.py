"""`localchat serve`: an OpenAI-compatible HTTP server (Litestar) over the AsyncEngine."""
