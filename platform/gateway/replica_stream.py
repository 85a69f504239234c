"""One `POST /generate` to a replica over a plain asyncio connection: the request, the status
and headers, then the body's bytes as they arrive (HTTP/1.1, chunked or sized).

The gateway relays every token of every stream through this, so it is kept to what that needs:
a profile of the API under 64 streams put a quarter of its CPU in the general HTTP client's
per-chunk layers. One connection per stream, closed when the stream ends: closing it is also
how an abandoned stream tells the replica to stop (its disconnect watcher aborts the request).
Only `http://` replicas (the replica API is internal); anything else is refused by name.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator, Mapping
from dataclasses import dataclass
from urllib.parse import urlsplit

MAX_HEAD_BYTES = 64 * 1024


class StreamBroken(Exception):
    """The connection failed, timed out, or the replica spoke something that is not HTTP/1.1."""


@dataclass
class ReplicaResponse:
    """The status and headers (lower-case names) of a replica's answer, and its body reader."""

    status: int
    headers: dict[str, str]
    _reader: asyncio.StreamReader
    _read_timeout_s: float

    async def _read(self, op: object) -> bytes:
        try:
            async with asyncio.timeout(self._read_timeout_s):
                return await op  # type: ignore[misc, no-any-return]  # a StreamReader read
        except TimeoutError:
            raise StreamBroken(f"no data for {self._read_timeout_s:g}s") from None
        except (asyncio.IncompleteReadError, asyncio.LimitOverrunError, OSError) as exc:
            raise StreamBroken(f"{type(exc).__name__}: {exc}") from exc

    async def body(self) -> AsyncIterator[bytes]:
        """The body's bytes as they arrive (de-chunked)."""
        if "chunked" in self.headers.get("transfer-encoding", "").lower():
            while True:
                line = await self._read(self._reader.readuntil(b"\r\n"))
                try:
                    size = int(line.split(b";", 1)[0].strip(), 16)
                except ValueError:
                    raise StreamBroken(f"bad chunk size line {line[:40]!r}") from None
                if size == 0:
                    return
                data = await self._read(self._reader.readexactly(size + 2))
                yield data[:-2]
        length = self.headers.get("content-length")
        if length is not None:
            if not length.isdigit():
                raise StreamBroken(f"bad content-length {length[:40]!r}")
            if int(length):
                yield await self._read(self._reader.readexactly(int(length)))
            return
        while chunk := await self._read(self._reader.read(65536)):  # until the server closes
            yield chunk

    async def read_all(self, limit: int = 1 << 20) -> bytes:
        """The whole (small) body: an error's."""
        out = b""
        async for chunk in self.body():
            out += chunk
            if len(out) > limit:
                break
        return out


@contextlib.asynccontextmanager
async def post_stream(
    url: str,
    path: str,
    body: bytes,
    headers: Mapping[str, str],
    *,
    connect_timeout_s: float,
    read_timeout_s: float,
) -> AsyncIterator[ReplicaResponse]:
    """POST `body` to `url` + `path` and yield the answer once its head has arrived; the
    connection is closed on exit, whatever happened."""
    parts = urlsplit(url)
    if parts.scheme != "http" or not parts.hostname:
        raise StreamBroken(f"replica URL {url!r}: only http://HOST:PORT replicas are served")
    port = parts.port or 80
    try:
        async with asyncio.timeout(connect_timeout_s):
            reader, writer = await asyncio.open_connection(
                parts.hostname, port, limit=MAX_HEAD_BYTES
            )
    except (TimeoutError, OSError) as exc:
        raise StreamBroken(f"connect: {type(exc).__name__}: {exc}") from exc
    try:
        lines = [f"POST {path} HTTP/1.1", f"host: {parts.netloc}", f"content-length: {len(body)}"]
        lines += [f"{k}: {v}" for k, v in headers.items()]
        writer.write(("\r\n".join(lines) + "\r\n\r\n").encode("latin-1") + body)
        response = ReplicaResponse(0, {}, reader, read_timeout_s)
        head = await response._read(reader.readuntil(b"\r\n\r\n"))
        status_line, *header_lines = head.decode("latin-1").split("\r\n")
        version, _, rest = status_line.partition(" ")
        if not version.startswith("HTTP/1.") or not rest[:3].isdigit():
            raise StreamBroken(f"not an HTTP/1.1 answer: {status_line[:80]!r}")
        response.status = int(rest[:3])
        for line in header_lines:
            name, sep, value = line.partition(":")
            if sep:
                response.headers[name.strip().lower()] = value.strip()
        yield response
    finally:
        writer.close()
        with contextlib.suppress(Exception):
            await asyncio.wait_for(writer.wait_closed(), 1.0)
