"""`localchat chat`: a Textual chat on the in-process engine or any OpenAI-compatible server."""
