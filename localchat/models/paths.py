"""Where localchat keeps its files: the cache root ($LOCALCHAT_CACHE_DIR, else the platform's user
cache directory) and, in it, the directory a GGUF file's config and tokenizer are converted into
(engine/loading/model_cache.py writes it), and the one of a GGUF model's image processor, made
with its mmproj file (engine/loading/mmproj.py)."""

from __future__ import annotations

from pathlib import Path

import platformdirs

from localchat import envs

# The converted directory's format (engine/loading/model_cache.py), part of its name, so a new
# format is written beside the old one. 4: a manifest of the files instead of a "done" marker; 5:
# every llama.cpp family (configs read as llama.cpp reads them, end-of-turn tokens among the EOS
# ids)
CONVERTED_FORMAT = 5


def cache_root() -> Path:
    """The directory everything localchat caches lives under."""
    return Path(envs.CACHE_DIR.get() or platformdirs.user_cache_dir("localchat"))


def converted_dir(gguf_path: Path) -> Path:
    """The converted directory of `gguf_path`, named after its stem, size and modification time."""
    stat = gguf_path.stat()
    return (
        cache_root()
        / "gguf"
        / f"{gguf_path.stem}-{stat.st_size}-{stat.st_mtime_ns}-v{CONVERTED_FORMAT}"
    )


# The image directory's format (engine/loading/mmproj.py), part of its name as CONVERTED_FORMAT is
MMPROJ_FORMAT = 1


def mmproj_dir(gguf_path: Path, mmproj_path: Path) -> Path:
    """The directory the image processor and multimodal config of a GGUF model with llama.cpp's
    image encoder (`mmproj_path`) are written into: named after the model's converted directory
    and the mmproj file's stem, size and modification time."""
    stat = mmproj_path.stat()
    name = f"{mmproj_path.stem}-{stat.st_size}-{stat.st_mtime_ns}-v{MMPROJ_FORMAT}"
    return cache_root() / "mmproj" / f"{converted_dir(gguf_path).name}+{name}"
