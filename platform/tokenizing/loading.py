"""A model folder's tokenizer: `tokenizer.json` through `tokenizers`, the special tokens and
end-of-sequence ids from `tokenizer_config.json` / `generation_config.json` / `config.json`,
and the chat template (`chat_template.py`). Nothing is ever downloaded."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tokenizers import Tokenizer

from loraplex.platform.tokenizing.chat_template import (
    TEMPLATE_FILE,
    ChatTemplate,
    load_chat_template,
)
from loraplex.platform.tokenizing.detokenizer import token_text
from loraplex.platform.tokenizing.token_bytes import TokenBytes

# The files that make up a tokenizer (fetched whole when a model lives in object storage).
TOKENIZER_FILES = (
    "tokenizer.json",
    "tokenizer_config.json",
    "generation_config.json",
    TEMPLATE_FILE,
    "special_tokens_map.json",
)


class TokenizerNotFound(FileNotFoundError):
    """The folder has no `tokenizer.json` (only fast tokenizers are supported)."""


def _read_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except ValueError as exc:
        raise ValueError(f"{path} is not valid JSON: {exc}") from None
    return data if isinstance(data, dict) else {}


def _token_text(value: Any) -> str | None:
    """A special token is a string or a serialized AddedToken (`{"content": ...}`)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class ModelTokenizer:
    """A `tokenizers.Tokenizer` with the model's special tokens and chat template."""

    tokenizer: Tokenizer
    template: ChatTemplate
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    _bytes: TokenBytes | None = field(default=None, init=False, repr=False, compare=False)

    @property
    def vocab_size(self) -> int:
        """Number of token ids, added tokens included."""
        return self.tokenizer.get_vocab_size(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        """Token ids of `text` (the tokenizer's post-processor adds BOS etc. if configured)."""
        return self.tokenizer.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        """Text of `ids`."""
        return self.tokenizer.decode(ids, skip_special_tokens=skip_special_tokens)

    def token_to_id(self, token: str) -> int | None:
        """The id of a token string (None when it is not in the vocabulary)."""
        return self.tokenizer.token_to_id(token)

    def token_bytes(self, token_id: int) -> bytes:
        """Raw bytes of one token (a byte-level token may be part of a character)."""
        return self._token_bytes_table()(token_id)

    def _token_bytes_table(self) -> TokenBytes:
        if self._bytes is None:
            self._bytes = TokenBytes(self.tokenizer)
        return self._bytes

    @property
    def decodes_by_bytes(self) -> bool:
        """True when decoding ids is exactly their bytes joined (byte-level BPE), so text can be
        decoded incrementally from `token_bytes` (see `detokenizer.py`)."""
        return self._token_bytes_table().concatenates

    def is_special(self, token_id: int) -> bool:
        """Whether `token_id` is a special token."""
        return self._token_bytes_table().is_special(token_id)

    def token_text(self, token_id: int) -> str:
        """How one token reads in logprobs (`bytes:\\xNN` for part of a character)."""
        return token_text(self, token_id)

    def apply_chat_template(
        self, messages: list[dict[str, Any]], add_generation_prompt: bool = True, **extra: Any
    ) -> str:
        """Render `messages` with the model's chat template (sandboxed)."""
        return self.template.render(messages, add_generation_prompt, **extra)


def load_tokenizer(path: str | Path) -> ModelTokenizer:
    """Load the tokenizer of a local HuggingFace model folder."""
    folder = Path(path)
    tok_file = folder / "tokenizer.json"
    if not tok_file.is_file():
        raise TokenizerNotFound(f"no tokenizer.json in {path}")
    tokenizer = Tokenizer.from_file(str(tok_file))
    cfg = _read_json(folder / "tokenizer_config.json")
    bos = _token_text(cfg.get("bos_token"))
    eos = _token_text(cfg.get("eos_token"))
    eos_ids: list[int] = []
    eos_id = None if eos is None else tokenizer.token_to_id(eos)
    if eos_id is not None:
        eos_ids.append(eos_id)
    for extra in ("generation_config.json", "config.json"):
        value = _read_json(folder / extra).get("eos_token_id")
        for tid in value if isinstance(value, list) else [value]:
            if isinstance(tid, int) and tid not in eos_ids:
                eos_ids.append(tid)
    return ModelTokenizer(
        tokenizer=tokenizer,
        template=load_chat_template(folder, cfg, bos, eos),
        bos_token=bos,
        eos_token=eos,
        pad_token=_token_text(cfg.get("pad_token")),
        bos_token_id=tokenizer.token_to_id(bos) if bos else None,
        eos_token_ids=eos_ids,
    )
