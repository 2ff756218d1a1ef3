"""A small fake of the Hugging Face hub's file API, enough for huggingface_hub's HfApi.model_info
(files_metadata) and its metadata HEAD and ranged GET of /{repo}/resolve/{revision}/{file}."""

from __future__ import annotations

import hashlib
import json
import re
import threading
import time
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote

LFS_THRESHOLD = 10_000  # files at least this big are served as LFS files (sha256 etag)


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclass
class Repo:
    files: dict[str, bytes]
    commit: str = "0123456789abcdef0123456789abcdef01234567"


@dataclass
class Behaviour:
    """Faults to inject: serve `corrupt` files with a flipped byte, cut the first `drop_times`
    GETs of `drop_file` after `drop_after` bytes, or stall after `stall_after` bytes (until the
    client goes away)."""

    corrupt: set[str] = field(default_factory=set)
    drop_file: str | None = None
    drop_after: int = 0
    drop_times: int = 0
    stall_file: str | None = None
    stall_after: int = 0
    # a hostile hub: the ETag sent for a file, in place of its checksum
    etags: dict[str, str] = field(default_factory=dict)
    # ... and the repo whose files it serves at any other path too, by their last name part (a
    # client normalizes `resolve/<commit>/../../x` to `/x`)
    anywhere: str | None = None


class _QuietServer(ThreadingHTTPServer):
    daemon_threads = True

    def handle_error(self, request, client_address) -> None:
        pass  # a client that went away mid-file (the tests cut and interrupt transfers)


class FakeHub:
    def __init__(self, repos: dict[str, Repo]):
        self.repos = repos
        self.behaviour = Behaviour()
        self.requests: list[dict] = []  # method, path, range, authorization
        self.sent: dict[str, int] = {}  # file -> body bytes written so far (all GETs)
        self.server = _QuietServer(("127.0.0.1", 0), _handler(self))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeHub:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.server.shutdown()
        self.server.server_close()

    def ranges(self, filename: str) -> list[str | None]:
        return [
            r["range"]
            for r in self.requests
            if r["method"] == "GET" and r["path"].endswith(filename)
        ]


def _etag(data: bytes) -> tuple[str, bool]:
    lfs = len(data) >= LFS_THRESHOLD
    return (hashlib.sha256(data).hexdigest() if lfs else git_sha1(data)), lfs


def _handler(hub: FakeHub) -> type[BaseHTTPRequestHandler]:
    resolve = re.compile(r"^/([^/]+/[^/]+)/resolve/([^/]+)/(.+)$")
    info = re.compile(r"^/api/models/([^/]+/[^/]+?)(?:/revision/([^/?]+))?(?:\?.*)?$")

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args) -> None:
            pass

        def _record(self) -> None:
            hub.requests.append(
                {
                    "method": self.command,
                    "path": self.path,
                    "range": self.headers.get("Range"),
                    "authorization": self.headers.get("Authorization"),
                }
            )

        def _not_found(self, code: str) -> None:
            self.send_response(404)
            self.send_header("X-Error-Code", code)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def do_GET(self) -> None:
            self._record()
            match = info.match(self.path)
            if match:
                return self._info(match.group(1))
            match = resolve.match(self.path)
            if match:
                return self._file(*match.groups(), body=True)
            if hub.behaviour.anywhere:
                return self._file(hub.behaviour.anywhere, "main", self.path[1:], body=True)
            self._not_found("RepoNotFound")

        def do_HEAD(self) -> None:
            self._record()
            match = resolve.match(self.path)
            if match:
                return self._file(*match.groups(), body=False)
            if hub.behaviour.anywhere:
                return self._file(hub.behaviour.anywhere, "main", self.path[1:], body=False)
            self._not_found("RepoNotFound")

        def _info(self, repo_id: str) -> None:
            repo = hub.repos.get(repo_id)
            if repo is None:
                return self._not_found("RepoNotFound")
            siblings = []
            for name, data in repo.files.items():
                etag, lfs = _etag(data)
                sibling: dict = {"rfilename": name, "size": len(data), "blobId": git_sha1(data)}
                if lfs:
                    sibling["lfs"] = {"size": len(data), "sha256": etag, "pointerSize": 134}
                siblings.append(sibling)
            body = json.dumps({"id": repo_id, "sha": repo.commit, "siblings": siblings}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _file(self, repo_id: str, revision: str, name: str, body: bool) -> None:
            repo = hub.repos.get(repo_id)
            revision, name = unquote(revision), unquote(name)
            if repo is None or revision not in ("main", repo.commit):
                return self._not_found("RepoNotFound" if repo is None else "RevisionNotFound")
            # a name the client normalized (`a/../b` sent as `b`) still finds its file
            data = repo.files.get(name) or next(
                (d for n, d in repo.files.items() if n.rsplit("/", 1)[-1] == name), None
            )
            if data is None:
                return self._not_found("EntryNotFound")
            etag, lfs = _etag(data)
            etag = hub.behaviour.etags.get(name, etag)
            if name in hub.behaviour.corrupt:
                data = data[:-1] + bytes([data[-1] ^ 0xFF])
            start = 0
            wanted = self.headers.get("Range")
            if wanted and body:
                start = int(re.match(r"bytes=(\d+)-", wanted).group(1))
            self.send_response(206 if start else 200)
            self.send_header("X-Repo-Commit", repo.commit)
            self.send_header("ETag", f'"{git_sha1(data) if lfs else etag}"')
            if lfs:
                self.send_header("X-Linked-Etag", f'"{etag}"')
                self.send_header("X-Linked-Size", str(len(data)))
            self.send_header("Accept-Ranges", "bytes")
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.end_headers()
            if body:
                self._send(name, data[start:])

        def _send(self, name: str, data: bytes) -> None:
            rule = hub.behaviour
            limit = len(data)
            stall = rule.stall_file == name
            drop = rule.drop_file == name and rule.drop_times > 0
            if drop:
                rule.drop_times -= 1
                limit = min(limit, rule.drop_after)
            if stall:
                limit = min(limit, rule.stall_after)
            for offset in range(0, limit, 65536):
                chunk = data[offset : min(offset + 65536, limit)]
                self.wfile.write(chunk)
                hub.sent[name] = hub.sent.get(name, 0) + len(chunk)
            self.wfile.flush()
            if stall:
                rule.stall_file = None  # stall once
                deadline = time.monotonic() + 60
                while time.monotonic() < deadline:
                    time.sleep(0.1)
                self.close_connection = True
            elif limit < len(data):
                self.close_connection = True  # cut: the client sees a short body

    return Handler
