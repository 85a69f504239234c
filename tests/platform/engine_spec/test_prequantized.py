"""The control plane's torch-free check of AWQ / GPTQ deployments: a checkpoint in a read
layout deploys with its own scheme only; a plain one cannot be deployed as awq / gptq; an unread
layout is refused saying what is served."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from loraplex.platform.engine_spec import engine_config_for_deployment
from loraplex.platform.engine_spec.prequantized import AwqGptqFormat, awq_gptq_format
from loraplex.platform.engine_spec.quantization import QuantizationRefused, check_quantization

LLAMA = dict(
    architectures=["LlamaForCausalLM"], hidden_size=4096, intermediate_size=14336,
    num_attention_heads=32, num_key_value_heads=8,
)  # fmt: skip
AWQ = {"quant_method": "awq", "bits": 4, "group_size": 128, "zero_point": True,
       "version": "gemm", "modules_to_not_convert": None}  # fmt: skip
GPTQ = {"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": True, "sym": False,
        "checkpoint_format": "gptq", "use_exllama": True,
        "exllama_config": {"version": 2}}  # fmt: skip


def _cfg(qc: dict | None = None, **changes) -> dict:
    return dict(LLAMA, quantization_config=dict(qc, **changes)) if qc else dict(LLAMA)


def test_read_layouts_parse_to_their_format() -> None:
    assert awq_gptq_format(_cfg(AWQ)) == AwqGptqFormat("awq", 128, False, False)
    assert awq_gptq_format(_cfg(GPTQ)) == AwqGptqFormat("gptq", 128, False, True)
    autoawq_keys = {"quant_method": "awq", "w_bit": 4, "q_group_size": 128, "version": "GEMM"}
    assert awq_gptq_format(_cfg(autoawq_keys)).method == "awq"
    assert awq_gptq_format(_cfg(AWQ, modules_to_not_convert=["lm_head"])).method == "awq"
    assert awq_gptq_format(_cfg(GPTQ, pack_dtype="torch.int32")).method == "gptq"
    assert awq_gptq_format(_cfg()) is None
    assert awq_gptq_format(_cfg({"quant_method": "compressed-tensors"})) is None


@pytest.mark.parametrize(("qc", "weights"), [(AWQ, "awq"), (GPTQ, "gptq")])
def test_a_checkpoint_deploys_with_its_own_scheme_only(qc, weights) -> None:
    check_quantization(weights, "auto", _cfg(qc))
    check_quantization(weights, "fp8", _cfg(qc), device="cpu")
    for other in ("int4", "int8", "bf16", "awq" if weights == "gptq" else "gptq"):
        with pytest.raises(QuantizationRefused, match=f"fixes its own scheme; deploy it with "
                           f"weights {weights}"):  # fmt: skip
            check_quantization(other, "auto", _cfg(qc))
    with pytest.raises(QuantizationRefused, match=f"{weights} weights run on cpu or cuda"):
        check_quantization(weights, "auto", _cfg(qc), device="mps")


@pytest.mark.parametrize("weights", ["awq", "gptq"])
def test_a_plain_checkpoint_cannot_be_deployed_as_awq_or_gptq(weights) -> None:
    with pytest.raises(QuantizationRefused, match="stores plain .* use int4"):
        check_quantization(weights, "auto", _cfg())


@pytest.mark.parametrize(
    ("qc", "changes", "why"),
    [(AWQ, {"version": "gemv"}, "version 'gemv'"),
     (AWQ, {"bits": 3}, "bits 3"),
     (AWQ, {"zero_point": False}, "zero_point false"),
     (AWQ, {"modules_to_not_convert": ["visual"]}, "modules_to_not_convert"),
     (GPTQ, {"group_size": -1}, "group_size -1"),
     (GPTQ, {"bits": 8}, "bits 8"),
     (GPTQ, {"checkpoint_format": "marlin"}, "checkpoint_format 'marlin'"),
     (GPTQ, {"lm_head": True}, "quantized lm_head"),
     (GPTQ, {"pack_dtype": "int16"}, "pack_dtype 'int16'")],
)  # fmt: skip
def test_unread_layouts_are_refused_with_what_is_served(qc, changes, why) -> None:
    with pytest.raises(QuantizationRefused) as err:
        check_quantization(qc["quant_method"], "auto", _cfg(qc, **changes))
    msg = str(err.value)
    assert why in msg and "served pre-quantized" in msg and "AWQ version gemm" in msg
    assert "deploy it with weights int8, int4 or fp8" in msg


def test_an_awq_deployment_runs_its_activations_in_bf16() -> None:
    base = SimpleNamespace(name="llama-awq", object_prefix="models/llama-awq/", config=_cfg(AWQ))
    row = SimpleNamespace(
        name="dep", weight_quantization="awq", kv_cache_dtype="auto", max_loras=4,
        max_lora_rank=16, expert_parallel_size=1, base_model=base,
    )  # fmt: skip
    config = engine_config_for_deployment(row, bucket="lpx")
    assert (config.quantization, config.dtype) == ("awq", "bfloat16")
