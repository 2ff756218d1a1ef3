"""Image encoders of vision-language models: a vision tower and the projector that turns its
output into the text model's embeddings (one row per image placeholder token)."""
