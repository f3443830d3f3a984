"""A local stand-in for the Hugging Face Hub (127.0.0.1, a thread): the routes huggingface_hub calls to list a
repository and download a file, with the headers it requires (file_download.get_hf_file_metadata: X-Repo-Commit,
ETag, Content-Length; Range for resumed downloads; X-Error-Code on 404s, which hf_raise_for_status reads)."""
from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Iterator

COMMIT = "0123456789abcdef0123456789abcdef01234567"


class FakeHub:
    """repos: {"owner/name": {"path/in/repo.gguf": local file path or bytes}}; ``requests`` logs (method, path,
    Range header)."""

    def __init__(self, repos: dict[str, dict[str, "str | bytes"]], token: str | None = None):
        self.repos, self.token = repos, token
        self.requests: list[tuple[str, str, str]] = []
        self.cut_after: int | None = None   # the next full GET of a file drops its connection after this many bytes

    def content(self, repo: str, name: str) -> bytes:
        data = self.repos[repo][name]
        if isinstance(data, bytes):
            return data
        with open(data, "rb") as f:
            return f.read()


def _handler(hub: FakeHub):
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *args):   # quiet
            pass

        def _refuse(self, status: int, code: str, message: str) -> None:
            body = json.dumps({"error": message}).encode()
            self.send_response(status)
            self.send_header("X-Error-Code", code)
            self.send_header("X-Error-Message", message)
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if self.command != "HEAD":
                self.wfile.write(body)

        def _authorized(self) -> bool:
            return hub.token is None or self.headers.get("authorization") == f"Bearer {hub.token}"

        def do_HEAD(self):
            self._serve()

        def do_GET(self):
            self._serve()

        def _serve(self):
            path = self.path.split("?")[0]
            hub.requests.append((self.command, path, self.headers.get("range", "")))
            api = re.fullmatch(r"/api/models/([^/]+/[^/]+)(?:/revision/([^/]+))?", path)
            resolve = re.fullmatch(r"/([^/]+/[^/]+)/resolve/([^/]+)/(.+)", path)
            repo = (api or resolve)[1] if (api or resolve) else None
            if repo is None:
                return self._refuse(404, "EntryNotFound", f"no route {path}")
            if repo not in hub.repos or not self._authorized():
                return self._refuse(401 if hub.token else 404, "RepoNotFound", f"Repository not found: {repo}")
            if api:
                body = json.dumps({"id": repo, "modelId": repo, "sha": COMMIT, "private": False,
                                   "siblings": [{"rfilename": n} for n in hub.repos[repo]]}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command == "GET":
                    self.wfile.write(body)
                return None
            name = resolve[3]
            if name not in hub.repos[repo]:
                return self._refuse(404, "EntryNotFound", f"{name} does not exist in {repo}")
            data = hub.content(repo, name)
            start = 0
            ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("range", ""))
            if ranged and self.command == "GET":
                start = int(ranged[1])
            self.send_response(206 if start else 200)
            self.send_header("ETag", '"' + hashlib.sha256(data).hexdigest() + '"')
            self.send_header("X-Repo-Commit", COMMIT)
            self.send_header("Content-Length", str(len(data) - start))
            if start:
                self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
            self.send_header("Accept-Ranges", "bytes")
            self.end_headers()
            if self.command == "GET" and hub.cut_after is not None and not start:
                self.wfile.write(data[:hub.cut_after])   # a network that fails mid-file
                self.wfile.flush()
                hub.cut_after = None
                self.close_connection = True
                self.connection.shutdown(socket.SHUT_RDWR)
            elif self.command == "GET":
                self.wfile.write(data[start:])
            return None

    return Handler


@contextlib.contextmanager
def serve_hub(hub: FakeHub) -> Iterator[str]:
    """The hub on a free port of 127.0.0.1; yields its URL (for HF_ENDPOINT)."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), _handler(hub))
    server.daemon_threads = True
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)


def hub_env(url: str, cache: str) -> dict[str, str]:
    """The environment a subprocess needs to use the fake hub and a private cache (no token, never online)."""
    env = dict(os.environ, HF_ENDPOINT=url, HF_HUB_CACHE=cache, HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_XET="1")
    env.pop("HF_TOKEN", None)
    env.pop("HF_HUB_OFFLINE", None)
    return env
