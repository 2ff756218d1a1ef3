"""transformers' own GGUF loading (the HF peer's), without its repeated parsing.

`from_pretrained(..., gguf_file=...)` reads the file's header with gguf-py twice (for the config,
then for the tensors: seconds each for a 49k-token vocabulary) and builds gguf-py's tensor name
map once per module of the model (397 times for SmolLM2-135M): its load took 20.9 s on a 2-core
host. Inside `shared_gguf_parsing()` each file's reader and each (architecture, layers) name map is
built once (11.7 s); what transformers computes from them is unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def shared_gguf_parsing() -> Iterator[None]:
    """gguf-py's GGUFReader and get_tensor_name_map, as transformers imports them from `gguf`
    at each call, built once per file and per (architecture, layers) while the block runs."""
    import gguf

    reader, name_map = gguf.GGUFReader, gguf.get_tensor_name_map
    readers: dict[tuple[str, str], gguf.GGUFReader] = {}

    def shared_reader(path, mode="r"):
        key = (str(path), mode)
        if key not in readers:
            readers[key] = reader(path, mode)
        return readers[key]

    setattr(gguf, "GGUFReader", shared_reader)  # noqa: B010 (a class, as mypy sees it)
    gguf.get_tensor_name_map = functools.cache(name_map)
    try:
        yield
    finally:
        setattr(gguf, "GGUFReader", reader)  # noqa: B010
        gguf.get_tensor_name_map = name_map
