"""The safetensors header parser against every rule of the reference reader."""

from __future__ import annotations

import json
import struct

import pytest
import torch
from safetensors.torch import save

from loraplex.loader.safetensors_header import (
    SafetensorsError,
    parse_file_prefix,
    parse_header,
    read_header_length,
)
from loraplex.loader.stream_reader import torch_dtype


def _file(header: dict, data: bytes, pad: int = 0) -> bytes:
    raw = json.dumps(header).encode() + b" " * pad
    return struct.pack("<Q", len(raw)) + raw + data


def _parse(blob: bytes):
    return parse_file_prefix(blob, len(blob))


def _two_tensors() -> dict:
    return {
        "a": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]},
        "b": {"dtype": "I8", "shape": [4], "data_offsets": [16, 20]},
    }


def test_valid_file_from_safetensors_save_is_accepted() -> None:
    tensors = {
        "w": torch.randn(3, 5),
        "h": torch.randn(7, dtype=torch.float16),
        "bf": torch.randn(2, 3, dtype=torch.bfloat16),
        "i": torch.arange(6, dtype=torch.int64),
        "m": torch.tensor([True, False]),
        "s": torch.tensor(3.0),
        "e": torch.zeros(0, 4),
    }
    blob = save(tensors, metadata={"format": "pt"})
    header = _parse(blob)
    assert set(header.tensors) == set(tensors)
    assert header.metadata == {"format": "pt"}
    assert header.file_size == len(blob)
    begins = [t.begin for t in header.tensors.values()]
    assert begins == sorted(begins)
    for name, info in header.tensors.items():
        ref = tensors[name]
        assert info.shape == tuple(ref.shape)
        assert torch_dtype(info.dtype) == ref.dtype
        assert info.nbytes == ref.numel() * ref.element_size()
        if info.nbytes == 0:
            continue
        got = torch.frombuffer(bytearray(blob[info.begin : info.end]), dtype=ref.dtype)
        assert torch.equal(got.reshape(ref.shape), ref)


def test_space_padded_header_and_absolute_offsets() -> None:
    blob = _file(_two_tensors(), bytes(20), pad=5)
    header = _parse(blob)
    assert header.data_start == 8 + header.header_len
    assert header.tensors["a"].begin == header.data_start
    assert header.tensors["b"].end == len(blob)


def test_short_file_rejected() -> None:
    with pytest.raises(SafetensorsError, match="too short"):
        read_header_length(b"\x01\x02", 2)
    with pytest.raises(SafetensorsError, match="too short"):
        read_header_length(b"\x00" * 8, 5)


def test_header_length_past_end_rejected() -> None:
    blob = struct.pack("<Q", 1000) + b"{}"
    with pytest.raises(SafetensorsError, match="past the end"):
        _parse(blob)


def test_oversized_header_rejected() -> None:
    with pytest.raises(SafetensorsError, match="header too large"):
        read_header_length(struct.pack("<Q", 100_000_001), 10**12)
    with pytest.raises(SafetensorsError, match="header too large"):
        read_header_length(struct.pack("<Q", 2048), 10**6, max_header_bytes=1024)


@pytest.mark.parametrize("raw", [b"{not json", b"\xff\xfe{}", b'{"a": 1, "a": 2}'])
def test_non_json_rejected(raw: bytes) -> None:
    with pytest.raises(SafetensorsError, match="invalid header"):
        parse_header(raw, 8 + len(raw))


@pytest.mark.parametrize("raw", [b"[1, 2]", b"  {}", b'"x"'])
def test_not_an_object_rejected(raw: bytes) -> None:
    with pytest.raises(SafetensorsError, match="invalid header"):
        parse_header(raw, 8 + len(raw))


def test_deeply_nested_json_rejected() -> None:
    raw = b'{"a":' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with pytest.raises(SafetensorsError, match="invalid"):
        parse_header(raw, 8 + len(raw))


@pytest.mark.parametrize("meta", [{"k": 1}, {"k": None}, ["x"], "x", {"k": {"n": "v"}}])
def test_bad_metadata_rejected(meta: object) -> None:
    with pytest.raises(SafetensorsError, match="metadata"):
        _parse(_file({"__metadata__": meta, **_two_tensors()}, bytes(20)))


def test_unknown_dtype_rejected() -> None:
    h = _two_tensors()
    h["b"]["dtype"] = "Q4"
    with pytest.raises(SafetensorsError, match="unknown dtype"):
        _parse(_file(h, bytes(20)))
    with pytest.raises(SafetensorsError, match="unknown dtype"):
        torch_dtype("Q4")


@pytest.mark.parametrize("shape", [[-1, 4], [2.0, 2], "4", [True, 4], None])
def test_bad_shape_rejected(shape: object) -> None:
    h = _two_tensors()
    h["a"]["shape"] = shape
    with pytest.raises(SafetensorsError, match="shape"):
        _parse(_file(h, bytes(20)))


@pytest.mark.parametrize("offsets", [[0], [0, 16, 20], [-1, 16], "0,16", [0.0, 16]])
def test_bad_offsets_rejected(offsets: object) -> None:
    h = _two_tensors()
    h["a"]["data_offsets"] = offsets
    with pytest.raises(SafetensorsError, match="data_offsets"):
        _parse(_file(h, bytes(20)))


def test_missing_field_rejected() -> None:
    h = _two_tensors()
    del h["a"]["dtype"]
    with pytest.raises(SafetensorsError, match="missing field 'dtype'"):
        _parse(_file(h, bytes(20)))


def test_gap_rejected() -> None:
    h = _two_tensors()
    h["b"]["data_offsets"] = [20, 24]
    with pytest.raises(SafetensorsError, match="gap"):
        _parse(_file(h, bytes(24)))


def test_data_not_starting_at_zero_rejected() -> None:
    h = {"a": {"dtype": "F32", "shape": [1], "data_offsets": [4, 8]}}
    with pytest.raises(SafetensorsError, match="contiguous from 0"):
        _parse(_file(h, bytes(8)))


def test_overlap_rejected() -> None:
    h = _two_tensors()
    h["b"]["data_offsets"] = [12, 16]
    with pytest.raises(SafetensorsError, match="overlap"):
        _parse(_file(h, bytes(16)))


def test_size_mismatch_rejected() -> None:
    h = _two_tensors()
    h["a"]["shape"] = [2, 3]
    with pytest.raises(SafetensorsError, match="size mismatch"):
        _parse(_file(h, bytes(20)))


@pytest.mark.parametrize("extra", [-1, 1, 100])
def test_file_length_mismatch_rejected(extra: int) -> None:
    data = bytes(20 + extra)
    with pytest.raises(SafetensorsError, match="file length mismatch"):
        _parse(_file(_two_tensors(), data))


def test_torch_dtype_mapping_covers_common_types() -> None:
    assert torch_dtype("BF16") is torch.bfloat16
    assert torch_dtype("F8_E4M3") is torch.float8_e4m3fn
    assert torch_dtype("BOOL") is torch.bool
    assert torch_dtype("U8") is torch.uint8
