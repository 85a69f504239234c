"""Hand-made safetensors bytes (for broken-file tests) and header reading."""

from __future__ import annotations

import json
import struct
from typing import Any


def safetensors_from_header(
    header: dict[str, Any], data_len: int, length: int | None = None, pad: int = 0
) -> bytes:
    """Raw safetensors bytes from a header dict and `data_len` zero bytes of data; `length`
    overrides the 8-byte header length (to build broken files)."""
    raw = json.dumps(header).encode() + b" " * pad
    n = len(raw) if length is None else length
    return struct.pack("<Q", n) + raw + bytes(data_len)


def read_header(data: bytes) -> dict[str, Any]:
    """The JSON header of safetensors bytes."""
    (n,) = struct.unpack("<Q", data[:8])
    return json.loads(data[8 : 8 + n])
