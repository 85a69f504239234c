"""The torch-free table of served architectures matches the engine's model registry, with the
right family for each (MoE classes are exactly those with the MoE decoder mixin)."""

from __future__ import annotations

import pytest

from loraplex.platform.engine_spec.supported_models import (
    SUPPORTED_ARCHITECTURES,
    served_architecture,
)


def test_table_equals_the_registry_and_families_match() -> None:
    from loraplex.platform.engine.models.moe_decoder import MoEDecoderMixin
    from loraplex.platform.engine.models.registry import (
        resolve_model_class,
        supported_architectures,
    )

    assert set(SUPPORTED_ARCHITECTURES) == set(supported_architectures())
    for arch, family in SUPPORTED_ARCHITECTURES.items():
        cls = resolve_model_class({"architectures": [arch]})
        assert family == ("moe" if issubclass(cls, MoEDecoderMixin) else "dense"), arch


def test_first_served_name_wins_and_unknown_is_none() -> None:
    assert served_architecture({"architectures": ["Foo", "Qwen3MoeForCausalLM"]}) == (
        "Qwen3MoeForCausalLM"
    )
    assert served_architecture({"architectures": "LlamaForCausalLM"}) == "LlamaForCausalLM"
    assert served_architecture({"architectures": ["GPT2LMHeadModel"]}) is None
    assert served_architecture({}) is None


def test_served_quantizations_are_what_the_engine_accepts() -> None:
    from loraplex.platform.db.models import WEIGHT_QUANTIZATIONS
    from loraplex.platform.engine.weight_quantization import resolve_weight_quantization
    from loraplex.platform.engine_spec.supported_models import SERVED_WEIGHT_QUANTIZATIONS

    assert set(SERVED_WEIGHT_QUANTIZATIONS) <= set(WEIGHT_QUANTIZATIONS)
    awq = {"quantization_config": {"quant_method": "awq", "bits": 4, "group_size": 128}}
    gptq = {"quantization_config": {"quant_method": "gptq", "bits": 4, "group_size": 128}}
    prequantized = {"awq": awq, "gptq": gptq}  # read from a checkpoint in that format only
    for choice in SERVED_WEIGHT_QUANTIZATIONS:
        assert resolve_weight_quantization(choice, prequantized.get(choice)).choice == choice
    for choice in prequantized:
        with pytest.raises(ValueError, match="use int4"):
            resolve_weight_quantization(choice)
    for choice in set(WEIGHT_QUANTIZATIONS) - set(SERVED_WEIGHT_QUANTIZATIONS):
        with pytest.raises(NotImplementedError):  # stored choices the engine does not serve yet
            resolve_weight_quantization(choice)
