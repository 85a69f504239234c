"""The API process must start without torch: importing the app (and the header parser it
uses for uploads) leaves torch out of `sys.modules`."""

from __future__ import annotations

import subprocess
import sys

import pytest


@pytest.mark.parametrize("module", ["loraplex.api.app", "loraplex.loader.safetensors_header"])
def test_import_leaves_torch_out(module: str) -> None:
    code = f"import sys, {module}; print('torch' in sys.modules)"
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.strip() == "False", f"{module} imported torch"


def test_header_dtypes_map_to_torch_in_the_loader() -> None:
    import torch

    from loraplex.loader.stream_reader import torch_dtype

    assert torch_dtype("BF16") is torch.bfloat16
