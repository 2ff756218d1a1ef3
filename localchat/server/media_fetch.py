"""http(s) image URLs fetched for `serve --allowed-media-domains` (as vLLM's option): without it the
server fetches nothing and such a URL is a 400 (server/images.py says so).

With it, an `image_url` part whose URL's host is one of the listed names (exactly, case aside) is
fetched with httpx, on the event loop without blocking it, before the prompt is rendered; the part
then holds the file as a data: URL, so the picture goes the way of an inline one. The Responses
API's `input_image` and Anthropic's URL image sources are fetched the same way (fetched_data_url,
called by their translate.py's fetch_images). Each fetch is guarded, every refusal a 400 naming
the part (`messages[0].content[1].image_url`, `input[0].content[1].image_url`,
`messages[0].content[1].source.url`) and why:

- only http and https;
- the host must be listed, and so must every redirect's (followed by hand, at most MAX_REDIRECTS);
- SSRF: a host whose address is private, loopback, link-local or otherwise not global is refused
  unless that address itself is listed (`--allowed-media-domains 127.0.0.1` lets a test serve
  images from this machine; listing `localhost` alone does not);
- the file may be at most MAX_IMAGE_BYTES (the cap on an inline image), read in chunks and cut off
  past it, whatever Content-Length says;
- the whole fetch, redirects included, may take LOCALCHAT_MEDIA_FETCH_TIMEOUT seconds;
- any status but 200 is refused with it; what comes back must then decode as an image (images.py).

The host is resolved once, here, and the connection goes to the address that was checked (the URL
names it, with the name in `Host` and, over https, in the TLS SNI, against which the certificate
is verified), so a DNS server that answers differently the second time (rebinding) gets no second
lookup to answer.
"""

from __future__ import annotations

import asyncio
import base64
import ipaddress
import socket
from collections.abc import Iterable

import httpx
import msgspec

from localchat import envs
from localchat.errors import InvalidParameterError
from localchat.server.images import MAX_IMAGE_BYTES, fetch_refused, is_remote
from localchat.server.protocol import ChatCompletionRequest

MAX_REDIRECTS = 3


def media_domains(values: Iterable[str] | None) -> frozenset[str]:
    """The hosts of `--allowed-media-domains` (repeatable or comma-separated), lower-cased, an IPv6
    address without its brackets."""
    names = (name.strip().lower().rstrip(".") for v in values or () for name in v.split(","))
    return frozenset(name.strip("[]") for name in names if name)


def _refuse(field: str, why: str) -> InvalidParameterError:
    return InvalidParameterError(f"{field}: {why}", param=field)


async def fetch_remote_images(
    data: ChatCompletionRequest, allowed: frozenset[str]
) -> ChatCompletionRequest:
    """`data` with each http(s) image URL replaced by the data: URL of the file it names (fetched
    when its host is in `allowed`; none is when `allowed` is empty: images.py refuses them)."""
    if not allowed:
        return data
    messages = list(data.messages)
    changed = False
    for i, message in enumerate(messages):
        if not isinstance(message.content, list):
            continue
        content = list(message.content)
        for j, part in enumerate(content):
            if part.image_url is None or not is_remote(part.image_url.url):
                continue
            field = f"messages[{i}].content[{j}].image_url"
            url = await fetched_data_url(part.image_url.url, field, allowed)
            image_url = msgspec.structs.replace(part.image_url, url=url)
            content[j] = msgspec.structs.replace(part, image_url=image_url)
            changed = True
        messages[i] = msgspec.structs.replace(message, content=content)
    return msgspec.structs.replace(data, messages=messages) if changed else data


async def fetched_data_url(url: str, field: str, allowed: frozenset[str]) -> str:
    """The file at the http(s) `url` as a data: URL (each API's image, whatever the shape it comes
    in, goes this way), fetched under the rules in the module's doc; a 400 naming `field` when it
    is refused, and when `allowed` is empty (the server fetches nothing)."""
    if not allowed:
        raise fetch_refused(field)
    file = await fetch_image(url, field, allowed)
    return "data:application/octet-stream;base64," + base64.b64encode(file).decode()


async def fetch_image(url: str, field: str, allowed: frozenset[str]) -> bytes:
    """The file at `url`, fetched under the rules in the module's doc, or a 400 naming `field`."""
    timeout = envs.MEDIA_FETCH_TIMEOUT.get()
    try:
        async with asyncio.timeout(timeout):
            return await _fetch(url, field, allowed, timeout)
    except (TimeoutError, httpx.TimeoutException):
        raise _refuse(field, f"fetching the image timed out after {timeout:g} s") from None
    except httpx.HTTPError as exc:
        raise _refuse(field, f"the image could not be fetched: {exc}") from None


async def _fetch(url: str, field: str, allowed: frozenset[str], timeout: float) -> bytes:
    async with httpx.AsyncClient(
        follow_redirects=False, timeout=timeout, trust_env=False
    ) as client:
        for _ in range(MAX_REDIRECTS + 1):
            request = _pinned(url, await _check_url(url, field, allowed))
            async with client.stream(
                "GET", request.url, headers=request.headers, extensions=request.extensions
            ) as response:
                if response.is_redirect:
                    location = response.headers.get("location")
                    if not location:
                        raise _refuse(field, "the image URL redirects without a Location")
                    url = str(httpx.URL(url).join(location))
                    continue
                if response.status_code != 200:
                    raise _refuse(
                        field,
                        f"fetching the image gave HTTP {response.status_code} "
                        f"{response.reason_phrase}".rstrip(),
                    )
                return await _read_capped(response, field)
    raise _refuse(field, f"the image URL redirects more than {MAX_REDIRECTS} times")


def _pinned(url: str, address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> httpx.Request:
    """A GET of `url` that connects to `address` (checked already): the URL names the address,
    `Host` the name (with the URL's port, if any), and over https the SNI the name too."""
    parsed = httpx.URL(url)
    headers = {"Host": parsed.netloc.decode("ascii").rpartition("@")[2]}
    extensions = {"sni_hostname": parsed.host} if parsed.scheme == "https" else {}
    return httpx.Request(
        "GET", parsed.copy_with(host=str(address)), headers=headers, extensions=extensions
    )


async def _read_capped(response: httpx.Response, field: str) -> bytes:
    too_large = _refuse(field, f"the image is larger than {MAX_IMAGE_BYTES >> 20} MiB")
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > MAX_IMAGE_BYTES:
        raise too_large
    body = bytearray()
    async for chunk in response.aiter_bytes():
        body += chunk
        if len(body) > MAX_IMAGE_BYTES:
            raise too_large
    return bytes(body)


async def _check_url(
    url: str, field: str, allowed: frozenset[str]
) -> ipaddress.IPv4Address | ipaddress.IPv6Address:
    """The address to fetch `url` from: refuse a URL that is not http(s), whose host is not
    listed, or whose host has a private address that is not itself listed."""
    try:
        parsed = httpx.URL(url)
    except httpx.InvalidURL as exc:
        raise _refuse(field, f"not a valid URL: {exc}") from None
    if parsed.scheme not in ("http", "https"):
        raise _refuse(field, f"only http and https image URLs are fetched, not {parsed.scheme}:")
    host = parsed.host.lower().rstrip(".")
    if host not in allowed:
        raise _refuse(field, f"the host {host or '(none)'} is not one of --allowed-media-domains")
    addresses = await _addresses(host, parsed.port or (443 if parsed.scheme == "https" else 80))
    for address in addresses:
        if not _public(address) and str(address) not in allowed:
            raise _refuse(
                field,
                f"the host {host} is at {address}, a private, loopback or link-local address; "
                "list that address in --allowed-media-domains to fetch from it",
            )
    if not addresses:
        raise httpx.ConnectError(f"cannot resolve {host}")
    return addresses[0]


async def _addresses(host: str, port: int) -> list[ipaddress.IPv4Address | ipaddress.IPv6Address]:
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    loop = asyncio.get_running_loop()
    try:
        found = await loop.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except OSError as exc:
        raise httpx.ConnectError(f"cannot resolve {host}: {exc}") from None
    return [ipaddress.ip_address(str(info[4][0]).split("%")[0]) for info in found]


def _public(address: ipaddress.IPv4Address | ipaddress.IPv6Address) -> bool:
    if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
        address = address.ipv4_mapped
    return address.is_global and not address.is_multicast
