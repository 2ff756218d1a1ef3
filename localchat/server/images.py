"""Images sent to the API (an OpenAI `image_url` part's URL) decoded into RGB pictures for the
model's own image processor, every bad one refused with a 400 naming the part.

Only `data:` URLs are read (base64 PNG, JPEG, WebP or a still GIF). http(s) URLs are refused: the
server fetches nothing unless `serve --allowed-media-domains` lists hosts, whose images
server/media_fetch.py fetches (with its SSRF guard) into data: URLs before they get here.
The encoded bytes are capped (MAX_IMAGE_BYTES), and the pixel count is checked from the header
before any pixel is decoded (MAX_IMAGE_PIXELS), so a 20,000 x 20,000 image, a decompression bomb,
costs nothing. A truncated file, a PDF or anything else with an image's name, and an animated GIF
(refused, not cut to its first frame: the reply would be about a picture the client did not mean)
are refused by name.
"""

from __future__ import annotations

import base64
import binascii
import io
import re

from localchat.errors import InvalidParameterError

MAX_IMAGE_BYTES = 20 << 20  # of the decoded file
MAX_IMAGE_PIXELS = 50_000_000  # width x height, read from the header
FORMATS = ("PNG", "JPEG", "WEBP", "GIF")
_DATA_URL = re.compile(
    r"^data:(?P<type>[\w.+-]+/[\w.+-]+)?(?P<params>(;[^,;]*)*),(?P<data>.*)$", re.S
)


def _refuse(field: str, why: str) -> InvalidParameterError:
    return InvalidParameterError(f"{field}: {why}", param=field)


def is_remote(url: str) -> bool:
    """Whether an image URL is http(s) (fetched by server/media_fetch.py, or refused)."""
    return re.match(r"^https?://", url, re.I) is not None


def fetch_refused(field: str) -> InvalidParameterError:
    """The 400 of an http(s) image URL sent to a server that fetches none."""
    return _refuse(
        field,
        "this server fetches no image URLs (serve --allowed-media-domains lists the hosts it "
        "may fetch from); send the image inline as a data: URL (data:image/png;base64,...)",
    )


def image_bytes(url: str, field: str) -> bytes:
    """The file a `data:` URL holds; `field` names the part in the error."""
    if is_remote(url):
        raise fetch_refused(field)
    match = _DATA_URL.match(url)
    if match is None:
        raise _refuse(field, "an image URL must be a data: URL (data:image/png;base64,...)")
    if ";base64" not in match.group("params"):
        raise _refuse(field, "a data: URL's image must be base64-encoded (;base64,)")
    payload = match.group("data")
    if len(payload) > MAX_IMAGE_BYTES * 4 // 3 + 4:
        raise _refuse(field, f"the image is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    try:
        return base64.b64decode(payload, validate=True)
    except (binascii.Error, ValueError):
        raise _refuse(field, "the data: URL is not valid base64") from None


def decode_image(data: bytes, field: str):
    """An RGB PIL image of `data` (PNG, JPEG, WebP or a still GIF)."""
    from PIL import Image, UnidentifiedImageError

    try:
        image = Image.open(io.BytesIO(data), formats=FORMATS)
    except Image.DecompressionBombError:  # PIL's own header check, past twice its limit
        raise _refuse(field, f"the image has more than {MAX_IMAGE_PIXELS:,} pixels") from None
    except (UnidentifiedImageError, OSError, ValueError):
        raise _refuse(field, f"not an image this server reads ({', '.join(FORMATS)})") from None
    width, height = image.size
    if width * height > MAX_IMAGE_PIXELS:
        raise _refuse(
            field, f"the image is {width} x {height} pixels, more than {MAX_IMAGE_PIXELS:,}"
        )
    if getattr(image, "n_frames", 1) > 1:
        raise _refuse(field, "animated images are not supported; send a still image (one frame)")
    try:
        image.load()
    except (OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        raise _refuse(field, "the image file is truncated or corrupt") from None
    return image.convert("RGB")


def image_from_url(url: str, field: str):
    """The RGB picture of an `image_url` part's URL, or a 400 naming `field`."""
    return decode_image(image_bytes(url, field), field)
