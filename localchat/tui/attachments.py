"""Images attached to a user message with `/image PATH [text]`: the file checked as the server
checks an API's image (PNG, JPEG, WebP or a still GIF, not truncated, not huge), then kept in the
message's `meta["images"]` as a data: URL with its name and size, so the history database holds
the picture and the message goes to a model (the in-process engine, or a server with --url) as an
OpenAI `image_url` part.

A file up to STORE_BYTES is kept as it is; a larger one (a phone's photo) is kept as a JPEG scaled
to at most STORE_SIDE pixels a side, so the database does not grow by megabytes a picture: vision
encoders see a few hundred pixels a side anyway (Gemma 3: 896). The marker in the chat says so.
"""

from __future__ import annotations

import base64
import io
import shlex
from dataclasses import asdict, dataclass
from pathlib import Path

from localchat.errors import InvalidParameterError
from localchat.server.images import MAX_IMAGE_BYTES, decode_image

STORE_BYTES = 2 << 20
STORE_SIDE = 2048
_TYPES = {"PNG": "image/png", "JPEG": "image/jpeg", "WEBP": "image/webp", "GIF": "image/gif"}


@dataclass
class Attachment:
    """An image of a user message: its file's name, its size in pixels, and the picture as a data:
    URL (`scaled`: kept smaller than the file, see the module's doc)."""

    name: str
    width: int
    height: int
    url: str
    scaled: bool = False

    @property
    def marker(self) -> str:
        """How the chat shows it: `[image: cat.png 640x480]`."""
        return f"[image: {self.name} {self.width}x{self.height}]"

    def to_dict(self) -> dict:
        return asdict(self)

    @classmethod
    def of(cls, data: dict) -> Attachment:
        return cls(**data)


def split_args(args: str) -> tuple[str, str]:
    """`/image PATH [text]`'s (path, text); a path with spaces is quoted (or is the whole
    argument)."""
    args = args.strip()
    if not args:
        raise InvalidParameterError("/image needs a file: /image PATH [text]", param="image")
    if args[0] in "\"'":
        try:
            lexer = shlex.shlex(args, posix=True)
            lexer.whitespace_split = True
            path = next(iter(lexer))
        except (ValueError, StopIteration):
            raise InvalidParameterError(f"/image: unbalanced quotes in {args}") from None
        return path, args[args.index(args[0], 1) + 1 :].strip()
    if Path(args).expanduser().is_file():
        return args, ""
    path, _, text = args.partition(" ")
    return path, text.strip()


def load_image(path: str) -> Attachment:
    """The image file at `path` as an Attachment; a one-line error naming the file when it is
    missing, unreadable, too large or not a picture."""
    file = Path(path).expanduser()
    name = file.name
    if not file.exists():
        raise InvalidParameterError(f"/image: no such file: {path}", param="image")
    if not file.is_file():
        raise InvalidParameterError(f"/image: not a file: {path}", param="image")
    try:
        if file.stat().st_size > MAX_IMAGE_BYTES:
            raise InvalidParameterError(
                f"/image: {name} is larger than {MAX_IMAGE_BYTES >> 20} MiB", param="image"
            )
        data = file.read_bytes()
    except OSError as exc:
        raise InvalidParameterError(
            f"/image: cannot read {path}: {exc.strerror or exc}", param="image"
        ) from None
    picture = decode_image(data, name)  # "cat.png: not an image ..." etc.
    from PIL import Image

    width, height = picture.size
    kind = _TYPES[Image.open(io.BytesIO(data)).format or "PNG"]
    scaled = len(data) > STORE_BYTES
    if scaled:
        picture.thumbnail((STORE_SIDE, STORE_SIDE))
        buffer = io.BytesIO()
        picture.save(buffer, "JPEG", quality=90)
        data, kind = buffer.getvalue(), "image/jpeg"
    url = f"data:{kind};base64,{base64.b64encode(data).decode()}"
    return Attachment(name, width, height, url, scaled)


def message_images(meta: dict) -> list[Attachment]:
    """The images a stored message carries."""
    return [Attachment.of(item) for item in meta.get("images") or []]


def shown_text(content: str, meta: dict) -> str:
    """A user message as the chat shows it: its images' markers, then its text."""
    markers = [image.marker for image in message_images(meta)]
    return "\n".join([" ".join(markers), content] if markers and content else markers or [content])


def wire_content(content: str, meta: dict) -> str | list[dict]:
    """A user message's content as OpenAI's API takes it: its text, or its images as `image_url`
    parts followed by its text."""
    images = message_images(meta)
    if not images:
        return content
    parts: list[dict] = [{"type": "image_url", "image_url": {"url": i.url}} for i in images]
    if content:
        parts.append({"type": "text", "text": content})
    return parts
