"""Fixtures for the control-plane test folders (imported into their conftest.py files): a tiny
base model and PEFT adapters over it (session), and each test module's own control plane with
that model registered (`cp_settings`, `base_model`)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from loraplex.bench._synthetic.models import save_random_model
from support.control_plane import control_plane
from support.peft_adapters import peft_adapter_dir


@pytest.fixture(scope="session")
def tiny_llama(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama in the HuggingFace layout (2 layers, hidden 64, vocab 256)."""
    path = tmp_path_factory.mktemp("tiny-llama")
    save_random_model(
        path, "llama", seed=0, init="hf", vocab_size=256, intermediate_size=128,
        max_position_embeddings=128,
    )  # fmt: skip
    return path


@pytest.fixture(scope="session")
def adapter_r4(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid PEFT adapter (rank 4 on q_proj, v_proj) for `tiny_llama`."""
    return peft_adapter_dir(tiny_llama, tmp_path_factory.mktemp("adapter-r4"), r=4, alpha=8)


@pytest.fixture(scope="session")
def adapter_r16(tiny_llama: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A valid PEFT adapter of rank 16 on every linear, rsLoRA (over an 8-rank limit)."""
    return peft_adapter_dir(
        tiny_llama,
        tmp_path_factory.mktemp("adapter-r16"),
        r=16,
        alpha=16,
        targets="all-linear",
        use_rslora=True,
    )


BASE_MODEL = "tiny-llama"


@pytest.fixture(scope="module")
def cp_settings(
    pg_url: str, settings: Any, s3_client: Any, request: pytest.FixtureRequest
) -> Iterator[Any]:
    """Settings over this test module's own database, bucket and queue."""
    with control_plane(pg_url, settings, s3_client, request.module.__name__) as s:
        yield s


@pytest.fixture(scope="module")
def base_model(cp_settings: Any, tiny_llama: Path) -> str:
    """The tiny Llama registered as a base model (through the real register function)."""
    from loraplex.platform.services.base_models import register_base_model

    register_base_model(cp_settings, BASE_MODEL, tiny_llama)
    return BASE_MODEL
