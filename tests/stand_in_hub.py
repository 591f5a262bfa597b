"""A stand-in for the Hugging Face Hub's file endpoint on 127.0.0.1, for tests of the real client
(huggingface_hub) without the network. Use with the `hf_env` fixture (conftest.py), which points the
client at it:

    with StandInHub({"timm/cait_xxs24_224.fb_dist_in1k/model.safetensors": data}) as hub:
        hf_env(hub.url)                 # HF_ENDPOINT, HF_HOME in tmp_path, HF_HUB_OFFLINE=0
        cait.load_model("cait_xxs24_224", pretrained=True)
        hub.methods()                   # ["HEAD", "GET"]
"""

from __future__ import annotations

import hashlib
import re
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer


class StandInHub:
    """A threaded HTTP server on 127.0.0.1 serving `files` ({"org/repo/filename": bytes}) the way the Hub
    does, and recording every request. die_after=N: the first GET sends its headers with the full
    Content-Length, then N bytes, and the server dies (later connections are refused)."""

    def __init__(self, files: dict[str, bytes], *, die_after: int | None = None):
        self.files = files
        self.die_after = die_after
        self.requests: list[str] = []  # "METHOD /path", in arrival order
        self.commit = hashlib.sha1(b"stand-in commit").hexdigest()
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), _HubHandler)
        self.server.daemon_threads, self.server.block_on_close = True, False
        self.server.hub = self
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True).start()

    def methods(self) -> list[str]:
        """The methods of the file requests (the client also asks {endpoint}/api/agent-harnesses once when
        online, for its user agent; that gets a 404 here)."""
        return [r.split()[0] for r in self.requests if "/resolve/" in r]

    def die(self) -> None:
        self.server.shutdown()
        self.server.server_close()  # the listening socket is gone: later connections are refused

    def __enter__(self) -> "StandInHub":
        return self

    def __exit__(self, *exc) -> None:
        self.die()


class _HubHandler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # quiet
        pass

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def do_GET(self) -> None:
        self._answer(body=True)

    def _answer(self, *, body: bool) -> None:
        hub_: StandInHub = self.server.hub
        hub_.requests.append(f"{self.command} {self.path}")
        match = re.fullmatch(r"/(?P<repo>[^/]+/[^/]+)/resolve/(?P<revision>[^/]+)/(?P<file>.+)", self.path)
        if match is None or not any(key.startswith(match["repo"] + "/") for key in hub_.files):
            return self._error("RepoNotFound")
        data = hub_.files.get(f"{match['repo']}/{match['file']}")
        if data is None:
            return self._error("EntryNotFound")
        ranged = re.fullmatch(r"bytes=(\d+)-", self.headers.get("Range", ""))
        start = int(ranged[1]) if ranged else 0
        etag = f'"{hashlib.sha256(data).hexdigest()}"'  # an LFS file's etag is its sha256
        self.send_response(206 if start else 200)
        headers = {
            "X-Repo-Commit": hub_.commit,
            "ETag": etag,
            "X-Linked-Etag": etag,
            "X-Linked-Size": len(data),
            "Content-Length": len(data) - start,
            "Accept-Ranges": "bytes",
            "Content-Type": "application/octet-stream",
        }
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        for key, value in headers.items():
            self.send_header(key, str(value))
        self.end_headers()
        if not body:
            return
        if hub_.die_after is not None:
            hub_.die()
            self.wfile.write(data[start : start + hub_.die_after])
            self.close_connection = True
            return
        self.wfile.write(data[start:])

    def _error(self, code: str) -> None:
        self.send_response(404)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Repo-Commit", self.server.hub.commit)
        self.send_header("Content-Length", "0")
        self.end_headers()
