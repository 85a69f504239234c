"""What the gateway needs from a base model's folder: the tokenizer (to count and route by
prompt tokens, and to turn streamed token ids into text), the chat template, the context
length and the end-of-sequence ids. Loaded once per base model and kept.
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from loraplex.platform.gateway.chat_template import ChatTemplate, load_chat_template

DEFAULT_CONTEXT_LENGTH = 2048


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    data = json.loads(path.read_text(encoding="utf-8"))
    return data if isinstance(data, dict) else {}


def _as_id_list(value: Any) -> list[int]:
    if isinstance(value, int):
        return [value]
    if isinstance(value, list):
        return [v for v in value if isinstance(v, int)]
    return []


@dataclass
class ModelAssets:
    """Tokenizer, chat template and limits of one base model."""

    tokenizer: Tokenizer
    template: ChatTemplate
    context_length: int
    eos_token_ids: list[int] = field(default_factory=list)

    @classmethod
    def load(cls, model_dir: Path) -> ModelAssets:
        """Read `tokenizer.json`, `tokenizer_config.json`, `config.json` and the template."""
        tok_path = model_dir / "tokenizer.json"
        if not tok_path.is_file():
            raise FileNotFoundError(f"{tok_path} is missing: the gateway needs a fast tokenizer")
        tokenizer = Tokenizer.from_file(str(tok_path))
        config = _read_json(model_dir / "config.json")
        gen = _read_json(model_dir / "generation_config.json")
        tok_cfg = _read_json(model_dir / "tokenizer_config.json")
        ctx = config.get("max_position_embeddings") or tok_cfg.get("model_max_length")
        if not isinstance(ctx, int) or ctx <= 0 or ctx > 10_000_000:
            ctx = DEFAULT_CONTEXT_LENGTH
        eos = _as_id_list(gen.get("eos_token_id")) or _as_id_list(config.get("eos_token_id"))
        return cls(tokenizer, load_chat_template(model_dir), ctx, eos)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text`."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def token_text(self, token_id: int) -> str:
        """The text of one token, as logprobs report it."""
        return self.tokenizer.decode([token_id], skip_special_tokens=False)


class Detokenizer:
    """Incremental detokenization: feed token ids, get new text; holds back a trailing
    partial UTF-8 character (shown as U+FFFD) until the next token completes it."""

    def __init__(self, tokenizer: Tokenizer) -> None:
        self._tok = tokenizer
        self.ids: list[int] = []
        self._prefix = 0  # ids before this are final and emitted
        self._read = 0  # ids[_prefix:_read] decode to text already emitted

    def push(self, token_ids: list[int]) -> str:
        """Add tokens; return the text they complete (maybe empty)."""
        self.ids.extend(token_ids)
        done = self._tok.decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        full = self._tok.decode(self.ids[self._prefix :], skip_special_tokens=True)
        if full.endswith("\ufffd") or len(full) < len(done):
            return ""
        new = full[len(done) :]
        self._prefix = max(self._prefix, self._read - 4)
        self._read = len(self.ids)
        return new

    def flush(self) -> str:
        """Text still held back at the end of the stream."""
        done = self._tok.decode(self.ids[self._prefix : self._read], skip_special_tokens=True)
        full = self._tok.decode(self.ids[self._prefix :], skip_special_tokens=True)
        self._read = len(self.ids)
        return full[len(done) :] if len(full) >= len(done) else ""


class AssetCache:
    """Per-base-model assets, loaded once from a folder `locate()` returns (thread-safe:
    concurrent first requests for one model wait for a single load)."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._assets: dict[str, ModelAssets] = {}
        self._loading: dict[str, threading.Lock] = {}

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
            return loaded
