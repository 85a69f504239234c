"""A recording stand-in for the Kubernetes API server (no cluster is reachable here): a real
HTTP server on loopback that the official `kubernetes` client talks to. It records every
request (method, path, query, content type, JSON body), answers apply patches with the body
applied, GETs with the objects it was given, and 404 for anything it does not hold."""

from __future__ import annotations

import json
import threading
from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlsplit


@dataclass
class Call:
    """One request the client sent."""

    method: str
    path: str
    query: dict[str, list[str]]
    content_type: str
    body: Any


class KubeApi:
    """`with KubeApi() as api:` then point `kubernetes.client.Configuration.host` at `api.url`;
    `api.objects[path]` are what GETs answer; `api.calls` what was sent."""

    def __init__(self) -> None:
        self.calls: list[Call] = []
        self.objects: dict[str, Any] = {}
        owner = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _handle(self) -> None:
                parts = urlsplit(self.path)
                length = int(self.headers.get("content-length") or 0)
                raw = self.rfile.read(length) if length else b""
                body = json.loads(raw) if raw else None
                owner.calls.append(Call(self.command, parts.path, parse_qs(parts.query),
                                        self.headers.get("content-type", ""), body))  # fmt: skip
                if self.command == "PATCH":
                    owner.objects[parts.path] = body
                    self._send(200, body)
                elif self.command == "DELETE" and parts.path in owner.objects:
                    del owner.objects[parts.path]
                    self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success"})
                elif self.command == "GET" and parts.path in owner.objects:
                    self._send(200, owner.objects[parts.path])
                else:
                    self._send(404, {"kind": "Status", "apiVersion": "v1", "status": "Failure",
                                     "reason": "NotFound", "code": 404})  # fmt: skip

            def _send(self, status: int, doc: Any) -> None:
                data = json.dumps(doc).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            do_GET = do_PATCH = do_DELETE = do_POST = do_PUT = _handle  # noqa: N815

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    def __enter__(self) -> KubeApi:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._server.shutdown()
        self._server.server_close()

    def api_client(self) -> Any:
        """A `kubernetes.client.ApiClient` talking to this server."""
        from kubernetes import client

        config = client.Configuration()
        config.host = self.url
        return client.ApiClient(config)
