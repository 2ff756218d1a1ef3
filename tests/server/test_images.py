"""Images in API requests (server/images.py): data: URLs of PNG, JPEG, WebP and still GIF files
decode to RGB pictures; every bad image is a 400 naming the part: truncated, an oversized header
(20,000 x 20,000, refused before a pixel is decoded), an animated GIF, a PDF under an image's
name, bad base64, and http(s) URLs, which this server does not fetch."""

from __future__ import annotations

import base64
import io
import struct
import zlib

import pytest
from PIL import Image

from localchat.errors import InvalidParameterError
from localchat.server.images import image_from_url

FIELD = "messages[0].content[1].image_url"


def _file(fmt: str, size=(12, 8), **options) -> bytes:
    buffer = io.BytesIO()
    noise = Image.frombytes(
        "RGB", size, bytes((i * 7919) % 251 for i in range(3 * size[0] * size[1]))
    )
    noise.save(buffer, fmt, **options)
    return buffer.getvalue()


def _url(data: bytes, kind: str = "image/png") -> str:
    return f"data:{kind};base64,{base64.b64encode(data).decode()}"


def _refused(url: str) -> str:
    with pytest.raises(InvalidParameterError) as error:
        image_from_url(url, FIELD)
    assert error.value.param == FIELD
    return str(error.value)


@pytest.mark.parametrize("fmt", ["PNG", "JPEG", "WEBP", "GIF"])
def test_data_urls_decode_to_rgb_pictures(fmt):
    picture = image_from_url(_url(_file(fmt), f"image/{fmt.lower()}"), FIELD)
    assert picture.mode == "RGB" and picture.size == (12, 8)


def test_one_pixel_is_a_picture():
    assert image_from_url(_url(_file("PNG", (1, 1))), FIELD).size == (1, 1)


def test_a_truncated_file_is_refused():
    data = _file("JPEG", (64, 64), quality=95)
    assert "truncated" in _refused(_url(data[: len(data) // 2], "image/jpeg"))


def _png_header(width: int, height: int) -> bytes:
    """A PNG whose header claims width x height (its one IDAT holds a single row)."""

    def chunk(kind: bytes, body: bytes) -> bytes:
        return (
            struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        )

    ihdr = struct.pack(">IIBBBBB", width, height, 8, 2, 0, 0, 0)
    row = zlib.compress(b"\x00" + b"\x00" * 3 * 16)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", row) + chunk(b"IEND", b"")


def test_a_huge_image_is_refused_from_its_header():
    assert "more than 50,000,000 pixels" in _refused(_url(_png_header(20_000, 20_000)))
    assert "9000 x 6000 pixels" in _refused(_url(_png_header(9000, 6000)))


def test_an_animated_gif_is_refused():
    frames = [Image.new("RGB", (8, 8), color) for color in ((255, 0, 0), (0, 0, 255))]
    buffer = io.BytesIO()
    frames[0].save(buffer, "GIF", save_all=True, append_images=frames[1:], duration=100)
    assert "animated" in _refused(_url(buffer.getvalue(), "image/gif"))


def test_a_pdf_named_as_an_image_is_refused():
    pdf = b"%PDF-1.4\n1 0 obj << /Type /Catalog >> endobj\ntrailer << /Root 1 0 R >>\n%%EOF\n"
    assert "not an image" in _refused(_url(pdf, "image/png"))


@pytest.mark.parametrize(
    ("url", "words"),
    [
        ("https://example.com/cat.png", "fetches no image URLs"),
        ("http://10.0.0.1/cat.png", "fetches no image URLs"),
        ("data:image/png,rawbytes", "base64"),
        ("data:image/png;base64,@@@not-base64@@@", "not valid base64"),
        ("file:///etc/passwd", "data: URL"),
    ],
)
def test_urls_other_than_base64_data_urls_are_refused(url, words):
    assert words in _refused(url)
