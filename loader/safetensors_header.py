"""Parse and validate a safetensors header exactly as the reference reader does.

The layout is: 8 bytes (u64 little-endian) header length N, then N bytes of JSON, then the
tensor data. Everything here works on bytes alone (no file, no network), so both the streaming
loader and adapter validation can check a header before a single weight byte is allocated.
"""

from __future__ import annotations

import json
import math
import struct
from dataclasses import dataclass, field

MAX_HEADER_BYTES = 100_000_000
"""The reference reader's cap on the JSON header length N."""

DTYPE_SIZES: dict[str, int] = {
    "BOOL": 1,
    "U8": 1,
    "I8": 1,
    "F8_E5M2": 1,
    "F8_E4M3": 1,
    "I16": 2,
    "U16": 2,
    "F16": 2,
    "BF16": 2,
    "I32": 4,
    "U32": 4,
    "F32": 4,
    "F64": 8,
    "I64": 8,
    "U64": 8,
}
"""Bytes per element of every dtype this reader accepts."""

TORCH_DTYPE_NAMES: dict[str, str] = {
    "BOOL": "bool",
    "U8": "uint8",
    "I8": "int8",
    "F8_E5M2": "float8_e5m2",
    "F8_E4M3": "float8_e4m3fn",
    "I16": "int16",
    "U16": "uint16",
    "F16": "float16",
    "BF16": "bfloat16",
    "I32": "int32",
    "U32": "uint32",
    "F32": "float32",
    "F64": "float64",
    "I64": "int64",
    "U64": "uint64",
}
"""The torch dtype name of each (torch-free here; `stream_reader.torch_dtype` maps it)."""

METADATA_KEY = "__metadata__"

MAX_TENSOR_RANK = 8
"""Most dimensions a tensor may have: checked before anything multiplies the shape (a shape of
hundreds of thousands of dimensions would cost minutes of big-integer products)."""

MAX_DIM = 2**64 - 1
"""Largest single dimension (the reference reader's usize)."""


class SafetensorsError(ValueError):
    """A safetensors file breaks a rule of the format; the message names the rule."""


@dataclass(frozen=True)
class TensorInfo:
    """One tensor's entry: dtype, shape and its byte range as ABSOLUTE file offsets [begin, end)."""

    name: str
    dtype: str
    shape: tuple[int, ...]
    begin: int
    end: int

    @property
    def nbytes(self) -> int:
        """Size of the tensor's data in bytes."""
        return self.end - self.begin

    @property
    def numel(self) -> int:
        """Number of elements."""
        return math.prod(self.shape)


@dataclass(frozen=True)
class SafetensorsHeader:
    """A validated header: tensors ordered by offset, metadata, and where the data starts."""

    header_len: int
    data_start: int
    tensors: dict[str, TensorInfo] = field(default_factory=dict)
    metadata: dict[str, str] = field(default_factory=dict)

    @property
    def data_bytes(self) -> int:
        """Total bytes of tensor data after the header."""
        if not self.tensors:
            return 0
        return next(reversed(self.tensors.values())).end - self.data_start

    @property
    def file_size(self) -> int:
        """The exact size the whole file must have."""
        return self.data_start + self.data_bytes


def read_header_length(
    first8: bytes, file_size: int, max_header_bytes: int = MAX_HEADER_BYTES
) -> int:
    """Decode the u64 little-endian header length N and check it against the cap and file size."""
    if file_size < 8 or len(first8) < 8:
        raise SafetensorsError(
            f"file too short: a safetensors file needs at least 8 bytes for the header length, "
            f"got {min(file_size, len(first8))}"
        )
    n: int = struct.unpack("<Q", bytes(first8[:8]))[0]
    if n > max_header_bytes:
        raise SafetensorsError(
            f"header too large: length {n} exceeds the cap of {max_header_bytes}"
        )
    if 8 + n > file_size:
        raise SafetensorsError(
            f"invalid header length: 8 + {n} runs past the end of the {file_size}-byte file"
        )
    return n


def _reject_duplicates(pairs: list[tuple[str, object]]) -> dict[str, object]:
    out: dict[str, object] = {}
    for key, value in pairs:
        if key in out:
            raise SafetensorsError(f"invalid header: duplicate key {key!r}")
        out[key] = value
    return out


def _is_uint(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def _load_json(header_bytes: bytes) -> dict[str, object]:
    try:
        text = bytes(header_bytes).decode("utf-8")
    except UnicodeDecodeError as exc:
        raise SafetensorsError(f"invalid header: not valid UTF-8 ({exc.reason})") from None
    if not text.startswith("{"):
        raise SafetensorsError("invalid header: the JSON header must start with '{'")
    try:
        obj = json.loads(text.rstrip(" "), object_pairs_hook=_reject_duplicates)
    except SafetensorsError:
        raise
    except (ValueError, RecursionError) as exc:
        raise SafetensorsError(f"invalid header: not valid JSON ({exc})") from None
    if not isinstance(obj, dict):
        raise SafetensorsError("invalid header: the JSON header must be an object")
    return obj


def _parse_metadata(raw: object) -> dict[str, str]:
    if not isinstance(raw, dict):
        raise SafetensorsError("invalid metadata: __metadata__ must be an object of strings")
    for key, value in raw.items():
        if not isinstance(value, str):
            raise SafetensorsError(
                f"invalid metadata: __metadata__[{key!r}] must be a string, "
                f"got {type(value).__name__}"
            )
    return dict(raw)


def _parse_entry(name: str, raw: object) -> tuple[str, tuple[int, ...], int, int]:
    if not isinstance(raw, dict):
        raise SafetensorsError(f"invalid tensor {name!r}: entry must be an object")
    for key in ("dtype", "shape", "data_offsets"):
        if key not in raw:
            raise SafetensorsError(f"invalid tensor {name!r}: missing field {key!r}")
    dtype = raw["dtype"]
    if not isinstance(dtype, str) or dtype not in DTYPE_SIZES:
        raise SafetensorsError(f"invalid tensor {name!r}: unknown dtype {dtype!r}")
    shape = raw["shape"]
    if not isinstance(shape, list):
        raise SafetensorsError(f"invalid tensor {name!r}: shape must be a list")
    if len(shape) > MAX_TENSOR_RANK:
        raise SafetensorsError(
            f"invalid tensor {name!r}: {len(shape)} dimensions, at most {MAX_TENSOR_RANK}"
        )
    if not all(_is_uint(d) and d <= MAX_DIM for d in shape):
        raise SafetensorsError(
            f"invalid tensor {name!r}: shape must be non-negative integers of at most "
            f"{MAX_DIM}, got {shape!r}"
        )
    offsets = raw["data_offsets"]
    if not (isinstance(offsets, list) and len(offsets) == 2 and all(_is_uint(o) for o in offsets)):
        raise SafetensorsError(
            f"invalid tensor {name!r}: data_offsets must be [begin, end] of non-negative "
            f"integers, got {offsets!r}"
        )
    return dtype, tuple(shape), offsets[0], offsets[1]


def parse_header(header_bytes: bytes, file_size: int) -> SafetensorsHeader:
    """Validate the N header bytes of a file of `file_size` bytes; return its tensors by offset."""
    n = len(header_bytes)
    data_start = 8 + n
    if data_start > file_size:
        raise SafetensorsError(
            f"invalid header length: 8 + {n} runs past the end of the {file_size}-byte file"
        )
    obj = _load_json(header_bytes)
    metadata: dict[str, str] = {}
    entries: list[tuple[int, int, str, str, tuple[int, ...]]] = []
    for name, raw in obj.items():
        if name == METADATA_KEY:
            metadata = _parse_metadata(raw)
            continue
        dtype, shape, begin, end = _parse_entry(name, raw)
        entries.append((begin, end, name, dtype, shape))
    entries.sort(key=lambda e: (e[0], e[1]))

    tensors: dict[str, TensorInfo] = {}
    cursor = 0
    for begin, end, name, dtype, shape in entries:
        if begin != cursor or end < begin:
            kind = "gap" if begin > cursor else "overlap"
            if end < begin:
                kind = "end before begin"
            raise SafetensorsError(
                f"invalid offsets for tensor {name!r}: [{begin}, {end}) does not start where the "
                f"previous tensor ended ({cursor}): {kind}; offsets must be contiguous from 0"
            )
        expected = math.prod(shape) * DTYPE_SIZES[dtype]
        if end - begin != expected:
            raise SafetensorsError(
                f"tensor {name!r} size mismatch: data_offsets span {end - begin} bytes but shape "
                f"{list(shape)} of {dtype} needs {expected}"
            )
        tensors[name] = TensorInfo(name, dtype, shape, data_start + begin, data_start + end)
        cursor = end
    if data_start + cursor != file_size:
        raise SafetensorsError(
            f"file length mismatch: header + data is {data_start + cursor} bytes but the file "
            f"is {file_size} bytes"
        )
    return SafetensorsHeader(
        header_len=n, data_start=data_start, tensors=tensors, metadata=metadata
    )


def parse_file_prefix(
    prefix: bytes, file_size: int, max_header_bytes: int = MAX_HEADER_BYTES
) -> SafetensorsHeader:
    """Validate a header from the file's first bytes (length prefix plus all N header bytes)."""
    n = read_header_length(prefix[:8], file_size, max_header_bytes)
    if len(prefix) < 8 + n:
        raise SafetensorsError(
            f"need the first {8 + n} bytes of the file to read its header, got {len(prefix)}"
        )
    return parse_header(bytes(prefix[8 : 8 + n]), file_size)
