"""http(s) image URLs with `serve --allowed-media-domains` (server/media_fetch.py), against a real
`localchat serve` of the tiny Gemma 3 VLM and a local http.server on a free port: a listed host's
picture is answered as the same picture inline is; an unlisted host, a redirect to one, a file
over the size cap, a page that is not an image, an HTTP error and a server slower than
LOCALCHAT_MEDIA_FETCH_TIMEOUT are each a 400 naming the part and why. The Responses API's
input_image and Anthropic's URL image sources go the same way, through the openai and anthropic
clients, each refusal named in that API's error shape. The SSRF guard (a listed name that resolves
to a loopback address) is held in-process: the server lists 127.0.0.1, where the images are."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import io
import ipaddress
import os
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import ClassVar
from unittest import mock

import msgspec
import pytest

from localchat.errors import InvalidParameterError
from localchat.server.images import MAX_IMAGE_BYTES
from localchat.server.media_fetch import fetch_image, media_domains

FIELD = "messages[0].content[0].image_url"


def _png_bytes() -> bytes:
    from tests.vision_models import images

    buffer = io.BytesIO()
    images(1, seed=13)[0].save(buffer, "PNG")
    return buffer.getvalue()


class _Handler(BaseHTTPRequestHandler):
    png = b""
    hosts: ClassVar[list[str]] = []  # the Host headers of /named.png's requests

    def log_message(self, *args):  # quiet
        pass

    def _send(self, status: int, body: bytes, kind: str = "image/png", **headers) -> None:
        self.send_response(status)
        self.send_header("Content-Type", kind)
        self.send_header("Content-Length", str(len(body)))
        for name, value in headers.items():
            self.send_header(name, value)
        self.end_headers()
        if self.command == "GET":
            self.wfile.write(body)

    def do_GET(self):
        port = self.server.server_address[1]
        if self.path == "/cat.png":
            self._send(200, self.png)
        elif self.path == "/named.png":
            _Handler.hosts.append(self.headers.get("Host", ""))
            self._send(200, self.png)
        elif self.path == "/hop":  # to the same, listed host
            self._send(302, b"", Location="/cat.png")
        elif self.path == "/away":  # to localhost, which is not listed
            self._send(302, b"", Location=f"http://localhost:{port}/cat.png")
        elif self.path == "/loop":
            self._send(302, b"", Location="/loop")
        elif self.path == "/big.png":
            self.send_response(200)
            self.send_header("Content-Type", "image/png")
            self.end_headers()  # no Content-Length: read until the cap
            chunk = b"\0" * (1 << 20)
            try:
                for _ in range((MAX_IMAGE_BYTES >> 20) + 2):
                    self.wfile.write(chunk)
            except OSError:  # the fetcher hung up at the cap
                pass
        elif self.path == "/page.png":
            self._send(200, b"<html><body>hello</body></html>", "text/html")
        elif self.path == "/slow.png":
            time.sleep(3)
            with contextlib.suppress(OSError):  # the fetcher gave up
                self._send(200, self.png)
        else:
            self._send(404, b"not here", "text/plain")


@pytest.fixture(scope="module")
def image_host():
    _Handler.png = _png_bytes()
    server = ThreadingHTTPServer(("127.0.0.1", 0), _Handler)
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield server.server_address[1]
    server.shutdown()
    server.server_close()


def test_the_option_reads_names_repeated_or_comma_separated():
    assert media_domains(["Example.com, other.org.", "[::1]", ""]) == {
        "example.com",
        "other.org",
        "::1",
    }
    assert media_domains(None) == frozenset()


def _fetch(url: str, allowed: set[str]) -> bytes:
    return asyncio.run(fetch_image(url, FIELD, frozenset(allowed)))


def _refused_here(url: str, allowed: set[str]) -> str:
    with pytest.raises(InvalidParameterError) as error:
        _fetch(url, allowed)
    assert error.value.param == FIELD
    return str(error.value)


def test_a_listed_name_at_a_loopback_address_is_refused_unless_the_address_is_listed(
    image_host,
):
    url = f"http://localhost:{image_host}/cat.png"
    assert "private, loopback or link-local" in _refused_here(url, {"localhost"})
    assert _fetch(url, {"localhost", "127.0.0.1"}) == _Handler.png
    assert "only http and https" in _refused_here("ftp://127.0.0.1/cat.png", {"127.0.0.1"})
    loop = f"http://127.0.0.1:{image_host}/loop"
    assert "redirects more than 3 times" in _refused_here(loop, {"127.0.0.1"})


# --- through a real server ------------------------------------------------------------------------


def test_the_connection_goes_to_the_address_that_was_checked(image_host, monkeypatch):
    """The host is resolved once, by the check: the fetch connects to that address with the name
    in Host, so a DNS answer that changes after the check (rebinding) is never asked for. Here the
    name (.test: reserved, resolves nowhere) has an address only in the check's lookup."""
    from localchat.server import media_fetch

    real = media_fetch._addresses

    async def checked_only(host: str, port: int):
        if host == "images.test":
            return [ipaddress.ip_address("127.0.0.1")]
        return await real(host, port)

    monkeypatch.setattr(media_fetch, "_addresses", checked_only)
    url = f"http://images.test:{image_host}/named.png"
    assert _fetch(url, {"images.test", "127.0.0.1"}) == _Handler.png
    assert _Handler.hosts[-1] == f"images.test:{image_host}"
    assert "private, loopback" in _refused_here(url, {"images.test"})


@pytest.fixture(scope="module")
def served(tmp_path_factory):
    from tests.serve_process import serve_process
    from tests.vision_models import save

    directory = tmp_path_factory.mktemp("gemma3-vlm")
    save(directory)
    log = tmp_path_factory.mktemp("vlm-media") / "serve.log"
    args = [str(directory), "--served-model-name", "vlm", "--max-model-len", "256"]
    args += ["--kv-cache-memory", "16MiB", "--threads", "1"]
    args += ["--allowed-media-domains", "example.com,127.0.0.1"]
    with (
        mock.patch.dict(os.environ, {"LOCALCHAT_MEDIA_FETCH_TIMEOUT": "1"}),
        serve_process(log, *args, timeout=180) as server,
    ):
        yield server


def _client(server):
    import openai

    return openai.OpenAI(base_url=f"{server.base_url}/v1", api_key="x", max_retries=0)


def _chat(server, url: str):
    content = [
        {"type": "image_url", "image_url": {"url": url}},
        {"type": "text", "text": "What do you see?"},
    ]
    return _client(server).chat.completions.create(
        model="vlm",
        messages=[{"role": "user", "content": content}],
        max_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )


@pytest.mark.slow
def test_a_listed_host_is_fetched_as_the_picture_inline(served, image_host):
    inline = "data:image/png;base64," + base64.b64encode(_Handler.png).decode()
    expected = _chat(served, inline).choices[0].message.content
    for path in ("/cat.png", "/hop"):  # a redirect within the listed host is followed
        reply = _chat(served, f"http://127.0.0.1:{image_host}{path}")
        assert reply.choices[0].message.content == expected


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("http://localhost:{port}/cat.png", "the host localhost is not one of"),
        ("http://127.0.0.1:{port}/away", "the host localhost is not one of"),
        ("http://127.0.0.1:{port}/big.png", "larger than 20 MiB"),
        ("http://127.0.0.1:{port}/page.png", "not an image"),
        ("http://127.0.0.1:{port}/gone.png", "HTTP 404"),
        ("http://127.0.0.1:{port}/slow.png", "timed out after 1 s"),
    ],
)
def test_a_refused_url_is_a_400_naming_the_part(served, image_host, where, words):
    import openai

    with pytest.raises(openai.BadRequestError) as error:
        _chat(served, where.format(port=image_host))
    assert error.value.body["param"] == FIELD
    assert words in error.value.body["message"], error.value.body["message"]


# --- the Responses API's input_image and Anthropic's URL image sources ----------------------------


def _fetch_items(items: list[dict], allowed: set[str]) -> list[dict]:
    from localchat.server.responses.translate import fetch_images

    return asyncio.run(fetch_images(items, frozenset(allowed)))


def test_responses_and_messages_fetch_through_the_chat_paths_guard(image_host):
    from localchat.server.anthropic.protocol import MessagesInput
    from localchat.server.anthropic.translate import fetch_images

    url = f"http://localhost:{image_host}/cat.png"
    inline = "data:application/octet-stream;base64," + base64.b64encode(_Handler.png).decode()
    part = {"type": "input_image", "image_url": url, "detail": "auto"}
    item = {"type": "message", "role": "user", "content": [part], "id": "msg_1"}
    assert _fetch_items([item], {"localhost", "127.0.0.1"}) == [
        {**item, "content": [{**part, "image_url": inline}]}
    ]
    with pytest.raises(InvalidParameterError) as error:  # a listed name at a loopback address
        _fetch_items([item], {"localhost"})
    assert error.value.param == "input[0].content[0].image_url"
    assert "private, loopback or link-local" in str(error.value)

    block = {"type": "image", "source": {"type": "url", "url": url}}
    data = msgspec.convert(
        {"model": "vlm", "messages": [{"role": "user", "content": [block]}]}, MessagesInput
    )
    fetched = asyncio.run(fetch_images(data, frozenset({"localhost", "127.0.0.1"})))
    assert fetched.messages[0].content[0].source == {"type": "url", "url": inline}
    for allowed, words in (({"localhost"}, "private, loopback"), (set(), "fetches no image")):
        with pytest.raises(InvalidParameterError) as error:
            asyncio.run(fetch_images(data, frozenset(allowed)))
        assert error.value.param == "messages[0].content[0].source.url"
        assert words in str(error.value)


def _respond(server, image_url: str):
    content = [
        {"type": "input_image", "image_url": image_url, "detail": "high"},  # detail is ignored
        {"type": "input_text", "text": "What do you see?"},
    ]
    return _client(server).responses.create(
        model="vlm",
        input=[{"role": "user", "content": content}],
        max_output_tokens=8,
        temperature=0,
        extra_body={"ignore_eos": True},
    )


def _message(server, source: dict):
    import anthropic

    claude = anthropic.Anthropic(base_url=server.base_url, api_key="x", max_retries=0)
    content = [{"type": "image", "source": source}, {"type": "text", "text": "What do you see?"}]
    return claude.messages.create(
        model="vlm",
        max_tokens=8,
        messages=[{"role": "user", "content": content}],
        extra_body={"ignore_eos": True, "temperature": 0},
    )


@pytest.mark.slow
def test_responses_and_messages_fetch_a_listed_host_as_the_picture_inline(served, image_host):
    url = f"http://127.0.0.1:{image_host}/hop"  # a redirect to /cat.png on the same host
    data = base64.b64encode(_Handler.png).decode()
    client = _client(served)

    inline = _respond(served, f"data:image/png;base64,{data}")
    response = _respond(served, url)
    assert response.output_text and response.output_text == inline.output_text
    assert response.usage.input_tokens == inline.usage.input_tokens  # the picture's tokens too
    # the stored input keeps the URL; a response continuing it reads the picture fetched then
    assert client.responses.input_items.list(response.id).data[0].content[0].image_url == url
    more = client.responses.create(
        model="vlm", previous_response_id=response.id, input="And?", max_output_tokens=2
    )
    assert more.usage.input_tokens > response.usage.input_tokens

    base64_source = {"type": "base64", "media_type": "image/png", "data": data}
    expected = _message(served, base64_source)
    reply = _message(served, {"type": "url", "url": url})
    assert reply.content and reply.content == expected.content
    assert reply.usage.input_tokens == expected.usage.input_tokens


@pytest.mark.slow
@pytest.mark.parametrize(
    ("where", "words"),
    [
        ("http://localhost:{port}/cat.png", "the host localhost is not one of"),
        ("http://10.0.0.1/cat.png", "the host 10.0.0.1 is not one of"),  # a private address
        ("http://127.0.0.1:{port}/away", "the host localhost is not one of"),  # redirected
        ("http://127.0.0.1:{port}/page.png", "not an image"),
    ],
)
def test_responses_and_messages_refuse_a_url_naming_the_field(served, image_host, where, words):
    import anthropic
    import openai

    url = where.format(port=image_host)
    with pytest.raises(openai.BadRequestError) as error:
        _respond(served, url)
    assert error.value.body["param"] == "input[0].content[0].image_url"
    assert words in error.value.body["message"], error.value.body["message"]

    with pytest.raises(anthropic.BadRequestError) as refused:
        _message(served, {"type": "url", "url": url})
    body = refused.value.body
    assert body["type"] == "error" and body["error"]["type"] == "invalid_request_error"
    message = body["error"]["message"]
    assert message.startswith("messages[0].content[0].source.url: ") and words in message
