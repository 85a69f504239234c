"""What the gateway needs from a base model's folder: the tokenizer and chat template (to
render and tokenize prompts: count them for limits, hash them for routing) and the context
length. Loaded once per base model and kept; the loading itself is the tokenizing package's.
"""

from __future__ import annotations

import gc
import json
import os
import tempfile
import threading
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loraplex.loader.object_store import ObjectStore
from loraplex.platform.tokenizing import TOKENIZER_FILES, ModelTokenizer, load_tokenizer

DEFAULT_CONTEXT_LENGTH = 2048
ASSET_FILES = (*TOKENIZER_FILES, "config.json")  # config: the context length and eos ids
MAX_ASSET_BYTES = 64 * 1024 * 1024


def fetch_model_assets(s3: Any, bucket: str, prefix: str, dest: Path) -> Path:
    """Download the tokenizer/template/config files under `prefix` into `dest` (once).

    Each file is optional and looked for by listing its exact key (`ObjectStore.find`): under
    our IAM policies a GET of a missing key is a 403, not a 404."""
    marker = dest / ".complete"
    if marker.is_file():
        return dest
    dest.mkdir(parents=True, exist_ok=True)
    store = ObjectStore.over(s3, bucket)
    for name in ASSET_FILES:
        info = store.find(prefix + name)
        if info is None:
            continue
        if info.size > MAX_ASSET_BYTES:
            raise ValueError(f"{prefix}{name} is {info.size} bytes, over {MAX_ASSET_BYTES}")
        body = store.get_range(info.key, 0, info.size)
        fd, tmp = tempfile.mkstemp(dir=dest, prefix=f".{name}.")
        with os.fdopen(fd, "wb") as fh:
            fh.write(body)
        os.replace(tmp, dest / name)
    marker.write_text("ok")
    return dest


def _context_length(model_dir: Path) -> int:
    """`max_position_embeddings` (config.json), else `model_max_length` (tokenizer_config)."""
    for name, key in (("config.json", "max_position_embeddings"),
                      ("tokenizer_config.json", "model_max_length")):  # fmt: skip
        path = model_dir / name
        data = json.loads(path.read_text(encoding="utf-8")) if path.is_file() else {}
        value = data.get(key) if isinstance(data, dict) else None
        if isinstance(value, int) and 0 < value <= 10_000_000:
            return value
    return DEFAULT_CONTEXT_LENGTH


def max_token_bytes(tokenizer: ModelTokenizer) -> int:
    """An upper bound on the bytes of text one token can stand for: the longest vocabulary
    entry in UTF-8 (a byte-level or byte-fallback entry is never shorter than the bytes it
    decodes to). A text of B bytes therefore has at least B / this many tokens."""
    vocab = tokenizer.tokenizer.get_vocab(with_added_tokens=True)
    return max((len(piece.encode("utf-8")) for piece in vocab), default=1) or 1


@dataclass
class ModelAssets:
    """Tokenizer (with its chat template), context length and the longest token in bytes
    (to refuse prompts by their length before tokenizing them) of one base model."""

    tokenizer: ModelTokenizer
    context_length: int
    max_token_bytes: int = 0

    def __post_init__(self) -> None:
        if self.max_token_bytes <= 0:
            self.max_token_bytes = max_token_bytes(self.tokenizer)

    def min_tokens(self, size: int) -> int:
        """The fewest tokens a text of `size` UTF-8 bytes can encode to (over the longest
        token)."""
        return -(-size // self.max_token_bytes)

    @classmethod
    def load(cls, model_dir: Path) -> ModelAssets:
        """Read the tokenizer files and `config.json` of `model_dir`."""
        return cls(load_tokenizer(model_dir), _context_length(model_dir))


class AssetCache:
    """Per-base-model assets, loaded once from a folder `locate()` returns (thread-safe:
    concurrent first requests for one model wait for a single load)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._assets: dict[str, ModelAssets] = {}
        self._loading: dict[str, threading.Lock] = {}

    def loaded(self, key: str) -> ModelAssets | None:
        """The assets for `key` if already loaded (never loads: safe on the event loop)."""
        with self._lock:
            return self._assets.get(key)

    def get(self, key: str, locate: Callable[[], Path]) -> ModelAssets:
        """The assets for `key`, loading them from `locate()` the first time."""
        with self._lock:
            found = self._assets.get(key)
            if found is not None:
                return found
            key_lock = self._loading.setdefault(key, threading.Lock())
        with key_lock:
            with self._lock:
                found = self._assets.get(key)
            if found is not None:
                return found
            loaded = ModelAssets.load(locate())
            with self._lock:
                self._assets[key] = loaded
            gc.freeze()  # kept for the process's life: out of the collector's scans
            return loaded
