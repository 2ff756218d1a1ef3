"""Models as ollama users expect: `pull` from the Hugging Face hub (resumed, verified), a local
registry of short names (`list`, `show`, `rm`, `alias`), each model's generation defaults, and
finding the files a MODEL argument names (source.py). It sits below the engine and never imports
it (tests/test_layering.py)."""
