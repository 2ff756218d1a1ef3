"""Models as ollama users expect: `pull` from the Hugging Face hub (resumed, verified), a local
registry of short names (`list`, `show`, `rm`, `alias`), and each model's generation defaults."""
