"""Fixtures for the loader tests: a fault-injecting proxy in front of the real S3 server."""

from __future__ import annotations

import socket
import socketserver
import threading

import pytest


class FaultProxy:
    """A loopback HTTP proxy in front of S3: relays requests verbatim (so SigV4 still matches),
    counts GETs and body bytes, and fails every `fail_every`-th ranged GET in turn with a 503,
    a connection dropped before the response, or a body cut off halfway."""

    KINDS = ("503", "drop-before", "drop-mid-body")

    def __init__(self, upstream: str, fail_every: int = 0) -> None:
        host, _, port = upstream.removeprefix("http://").rstrip("/").partition(":")
        self.upstream = (host, int(port or 80))
        self.fail_every = fail_every
        self.lock = threading.Lock()
        self.gets = 0
        self.ranged = 0
        self.body_bytes = 0
        self.faults: dict[str, int] = {}
        proxy = self

        class Handler(socketserver.BaseRequestHandler):
            def handle(self) -> None:
                proxy._serve(self.request)

        self.server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), Handler)
        self.server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> FaultProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=5)

    @staticmethod
    def _read_head(f) -> tuple[bytes, dict[str, str]] | None:
        lines = []
        while True:
            line = f.readline(65536)
            if not line:
                return None
            lines.append(line)
            if line in (b"\r\n", b"\n"):
                break
        headers = {}
        for line in lines[1:-1]:
            k, _, v = line.decode("latin-1").partition(":")
            headers[k.strip().lower()] = v.strip()
        return b"".join(lines), headers

    def _decide(self, method: str, headers: dict[str, str]) -> str | None:
        with self.lock:
            if method == "GET":
                self.gets += 1
            if method != "GET" or "range" not in headers:
                return None
            self.ranged += 1
            if not self.fail_every or self.ranged % self.fail_every:
                return None
            kind = self.KINDS[(self.ranged // self.fail_every) % len(self.KINDS)]
            self.faults[kind] = self.faults.get(kind, 0) + 1
            return kind

    def _serve(self, client: socket.socket) -> None:
        cf = client.makefile("rb")
        while True:
            got = self._read_head(cf)
            if got is None:
                return
            head, headers = got
            method = head.split(b" ", 1)[0].decode()
            body = cf.read(int(headers.get("content-length", 0) or 0))
            fault = self._decide(method, headers)
            if fault == "drop-before":
                client.close()
                return
            if fault == "503":
                msg = b"<Error><Code>SlowDown</Code><Message>injected</Message></Error>"
                client.sendall(
                    b"HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/xml\r\n"
                    + f"Content-Length: {len(msg)}\r\n\r\n".encode()
                    + msg
                )
                continue
            if not self._relay(client, head + body, method, cut=fault == "drop-mid-body"):
                return

    def _relay(self, client: socket.socket, request: bytes, method: str, cut: bool) -> bool:
        with socket.create_connection(self.upstream) as up:
            up.sendall(request)
            uf = up.makefile("rb")
            got = self._read_head(uf)
            if got is None:
                client.close()
                return False
            head, headers = got
            length = 0 if method == "HEAD" else int(headers.get("content-length", 0) or 0)
            client.sendall(head)
            todo = length // 2 if cut else length
            while todo:
                chunk = uf.read(min(todo, 1 << 16))
                if not chunk:
                    break
                client.sendall(chunk)
                todo -= len(chunk)
                with self.lock:
                    self.body_bytes += len(chunk)
            if cut:
                client.shutdown(socket.SHUT_RDWR)
                client.close()
                return False
        return True


@pytest.fixture
def fault_proxy() -> type[FaultProxy]:
    """The `FaultProxy` class: `with fault_proxy(upstream_url, fail_every=3) as proxy: ...`."""
    return FaultProxy
