"""Read a HuggingFace-layout model folder from local disk (never downloads).

`config.json`, and weights as one `model.safetensors`, shards listed in
`model.safetensors.index.json`, or any `*.safetensors` files. Tensors are yielded lazily one at
a time so a large checkpoint never sits in memory twice.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import torch
from safetensors import safe_open

CONFIG_FILE = "config.json"
SINGLE_FILE = "model.safetensors"
INDEX_FILE = "model.safetensors.index.json"


class ModelFolderError(ValueError):
    """The folder is missing or does not hold a usable HuggingFace model."""


def _folder(path: str | Path) -> Path:
    folder = Path(path)
    if not folder.is_dir():
        raise ModelFolderError(
            f"model path {str(path)!r} is not a local directory (downloading is not supported)"
        )
    return folder


def read_json(path: Path) -> dict[str, Any]:
    """Parse a JSON object file with a clear error on bad content."""
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise ModelFolderError(f"{path.name} is not valid JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise ModelFolderError(f"{path.name} must hold a JSON object")
    return data


def read_config(path: str | Path) -> dict[str, Any]:
    """The model's `config.json` as a dict."""
    cfg = _folder(path) / CONFIG_FILE
    if not cfg.is_file():
        raise ModelFolderError(f"no {CONFIG_FILE} in {path}")
    return read_json(cfg)


def safetensors_files(path: str | Path) -> list[Path]:
    """The weight files of the model, in a stable order."""
    folder = _folder(path)
    index = folder / INDEX_FILE
    if index.is_file():
        weight_map = read_json(index).get("weight_map")
        if not isinstance(weight_map, dict) or not weight_map:
            raise ModelFolderError(f"{INDEX_FILE} has no weight_map")
        files = [folder / name for name in sorted(set(weight_map.values()))]
        absent = [f.name for f in files if not f.is_file()]
        if absent:
            raise ModelFolderError(f"shards listed in {INDEX_FILE} are missing: {absent}")
        return files
    if (folder / SINGLE_FILE).is_file():
        return [folder / SINGLE_FILE]
    files = sorted(folder.glob("*.safetensors"))
    if not files:
        raise ModelFolderError(f"no *.safetensors weights in {path} (.bin is not supported)")
    return files


def _row_runs(rows: Sequence[int]) -> list[tuple[int, int]]:
    """Consecutive rows merged into [start, stop) runs, in the order given."""
    runs: list[tuple[int, int]] = []
    for r in rows:
        if runs and runs[-1][1] == r:
            runs[-1] = (runs[-1][0], r + 1)
        else:
            runs.append((r, r + 1))
    return runs


def iter_weights(
    path: str | Path,
    keep: Callable[[str], bool] | None = None,
    rows: Callable[[str], Sequence[int] | None] | None = None,
) -> Iterator[tuple[str, torch.Tensor]]:
    """Yield (name, tensor) for every tensor of every weight file, lazily, on CPU.

    `keep` skips tensors without reading their bytes; `rows(name)` reads only those rows of a
    tensor's leading dimension (e.g. one expert-parallel rank's experts of a fused tensor),
    handed on in the order given.
    """
    for file in safetensors_files(path):
        with safe_open(str(file), framework="pt", device="cpu") as f:
            for name in f.keys():  # noqa: SIM118 - safe_open is not a mapping
                if keep is not None and not keep(name):
                    continue
                picked = rows(name) if rows is not None else None
                if picked is None:
                    yield name, f.get_tensor(name)
                    continue
                part = f.get_slice(name)
                n = part.get_shape()[0]
                if any(not 0 <= r < n for r in picked) or len(set(picked)) != len(picked):
                    raise ModelFolderError(f"{name}: bad row slice {list(picked)} of {n} rows")
                chunks = [part[a:b] for a, b in _row_runs(picked)] or [part[0:0]]
                yield name, torch.cat(chunks)
