"""Pure adapter validation (no services): config + safetensors header + base config."""

from __future__ import annotations

import json
import struct

import pytest

from loraplex.adapters.validation import (
    AdapterValidationError,
    sniff_pickle,
    validate_adapter,
)

BASE = {
    "hidden_size": 64,
    "intermediate_size": 128,
    "num_hidden_layers": 2,
    "num_attention_heads": 4,
    "num_key_value_heads": 2,
}
CONFIG = {"r": 4, "lora_alpha": 8, "target_modules": ["q_proj", "v_proj"], "peft_type": "LORA"}
P = "base_model.model.model.layers.{i}.self_attn.{m}.lora_{k}.weight"


def _tensors(r: int = 4, dtype: str = "F32") -> dict[str, tuple[str, list[int]]]:
    out = {}
    for i in range(2):
        out[P.format(i=i, m="q_proj", k="A")] = (dtype, [r, 64])
        out[P.format(i=i, m="q_proj", k="B")] = (dtype, [64, r])
        out[P.format(i=i, m="v_proj", k="A")] = (dtype, [r, 64])
        out[P.format(i=i, m="v_proj", k="B")] = (dtype, [32, r])
    return out


def _file(tensors: dict[str, tuple[str, list[int]]]) -> bytes:
    size = {"F32": 4, "BF16": 2, "F16": 2, "I8": 1}
    header, off = {}, 0
    for name, (dtype, shape) in tensors.items():
        n = size[dtype] * shape[0] * shape[1]
        header[name] = {"dtype": dtype, "shape": shape, "data_offsets": [off, off + n]}
        off += n
    raw = json.dumps(header).encode()
    return struct.pack("<Q", len(raw)) + raw + bytes(off)


def _validate(config: dict | bytes | None, data: bytes, max_rank: int = 8):
    cfg = json.dumps(config).encode() if isinstance(config, dict) else config
    return validate_adapter(cfg, data, len(data), BASE, max_rank=max_rank)


def test_valid_adapter_passes_with_its_facts() -> None:
    result = _validate(CONFIG, _file(_tensors()))
    assert (result.rank, result.alpha, result.use_rslora) == (4, 8.0, False)
    assert result.target_modules == ["q_proj", "v_proj"] and result.tensor_count == 8
    assert _validate(CONFIG, _file(_tensors(dtype="BF16"))).dtypes == ["BF16"]


def test_rank_pattern_sets_per_module_rank() -> None:
    cfg = {**CONFIG, "rank_pattern": {"v_proj": 2}}
    tensors = _tensors()
    for i in range(2):
        tensors[P.format(i=i, m="v_proj", k="A")] = ("F32", [2, 64])
        tensors[P.format(i=i, m="v_proj", k="B")] = ("F32", [32, 2])
    assert _validate(cfg, _file(tensors)).rank == 4
    with pytest.raises(AdapterValidationError, match="shape"):
        _validate(cfg, _file(_tensors()))


@pytest.mark.parametrize(
    ("mutate", "code"),
    [
        (lambda t: {**t, P.format(i=0, m="q_proj", k="A"): ("F32", [4, 63])}, "shape_mismatch"),
        (lambda t: {k: ("I8", s) for k, (_, s) in t.items()}, "unsupported_dtype"),
        (
            lambda t: {k: v for k, v in t.items() if "layers.1.self_attn.v_proj.lora_B" not in k},
            "missing_pair",
        ),
        (lambda t: {**t, P.format(i=5, m="q_proj", k="A"): ("F32", [4, 64])}, "unknown_module"),
        (
            lambda t: {**t, "base_model.model.lm_head.lora_A.weight": ("F32", [4, 64])},
            "unknown_module",
        ),
        (lambda t: {}, "empty_adapter"),
    ],
)
def test_bad_tensors(mutate, code: str) -> None:
    with pytest.raises(AdapterValidationError) as info:
        _validate(CONFIG, _file(mutate(_tensors())))
    assert info.value.code == code and info.value.reason


def test_rank_limit() -> None:
    with pytest.raises(AdapterValidationError, match="rank 16") as info:
        _validate({**CONFIG, "r": 16}, _file(_tensors(r=16)), max_rank=8)
    assert info.value.code == "rank_too_large"
    assert _validate({**CONFIG, "r": 16}, _file(_tensors(r=16)), max_rank=16).rank == 16


@pytest.mark.parametrize(
    ("config", "code"),
    [
        (None, "invalid_config"),
        (b"", "invalid_config"),
        (b"{oops", "invalid_config"),
        ({**CONFIG, "use_dora": True}, "invalid_config"),
        ({**CONFIG, "modules_to_save": ["lm_head"]}, "invalid_config"),
        (b"{" + b" " * 70_000 + b"}", "config_too_large"),
    ],
)
def test_bad_configs(config, code: str) -> None:
    with pytest.raises(AdapterValidationError) as info:
        _validate(config, _file(_tensors()))
    assert info.value.code == code


def test_framing_errors() -> None:
    good = _file(_tensors())
    for data, fragment in [
        (good[:-1], "length mismatch"),
        (struct.pack("<Q", len(good)) + good[8:], "past the end"),
        (struct.pack("<Q", 1 << 40) + good[8:], "too large"),
        (good[:5], "too short"),
    ]:
        with pytest.raises(AdapterValidationError, match=fragment) as info:
            _validate(CONFIG, data)
        assert info.value.code == "invalid_safetensors"


def test_pickles_are_sniffed_and_refused() -> None:
    assert sniff_pickle(b"\x80\x04\x95abc") == "pickle protocol 4"
    assert sniff_pickle(b"PK\x03\x04....") is not None
    assert sniff_pickle(_file(_tensors())[:8]) is None
    with pytest.raises(AdapterValidationError) as info:
        _validate(CONFIG, b"\x80\x02" + bytes(100))
    assert info.value.code == "pickle_refused"
