"""Tokenizer from a HuggingFace folder: `tokenizer.json` through `tokenizers`, plus the special
tokens and chat template from `tokenizer_config.json` (or `chat_template.jinja`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

import jinja2
from jinja2.sandbox import ImmutableSandboxedEnvironment
from tokenizers import Tokenizer

from loraplex.platform.engine.hf_folder import ModelFolderError, read_json


def _token_text(value: Any) -> str | None:
    if isinstance(value, dict):
        return value.get("content")
    return value if isinstance(value, str) else None


@dataclass
class HFTokenizer:
    """A `tokenizers.Tokenizer` with the model's special tokens and chat template."""

    tokenizer: Tokenizer
    bos_token: str | None = None
    eos_token: str | None = None
    pad_token: str | None = None
    bos_token_id: int | None = None
    eos_token_ids: list[int] = field(default_factory=list)
    chat_template: str | None = None

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

    def apply_chat_template(
        self,
        messages: list[dict[str, Any]],
        add_generation_prompt: bool = True,
        **kwargs: Any,
    ) -> str:
        """Render `messages` with the model's Jinja chat template (sandboxed)."""
        if not self.chat_template:
            raise ValueError("this model has no chat template")
        env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)

        def raise_exception(message: str) -> None:
            raise jinja2.TemplateError(message)

        env.globals["raise_exception"] = raise_exception
        env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
        return env.from_string(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
            **kwargs,
        )


def load_tokenizer(path: str | Path) -> HFTokenizer:
    """Load the tokenizer of a local HuggingFace model folder."""
    folder = Path(path)
    tok_file = folder / "tokenizer.json"
    if not tok_file.is_file():
        raise ModelFolderError(f"no tokenizer.json in {path}")
    tokenizer = Tokenizer.from_file(str(tok_file))
    cfg_file = folder / "tokenizer_config.json"
    cfg = read_json(cfg_file) if cfg_file.is_file() else {}
    template = cfg.get("chat_template")
    if isinstance(template, list):  # named templates: take the default one
        named = {t.get("name"): t.get("template") for t in template if isinstance(t, dict)}
        template = named.get("default") or next(iter(named.values()), None)
    jinja_file = folder / "chat_template.jinja"
    if template is None and jinja_file.is_file():
        template = jinja_file.read_text(encoding="utf-8")
    bos = _token_text(cfg.get("bos_token"))
    eos = _token_text(cfg.get("eos_token"))
    pad = _token_text(cfg.get("pad_token"))
    eos_ids: list[int] = []
    if eos is not None and tokenizer.token_to_id(eos) is not None:
        eos_ids.append(tokenizer.token_to_id(eos))
    gen_file = folder / "generation_config.json"
    model_cfg_file = folder / "config.json"
    for extra in (gen_file, model_cfg_file):
        if extra.is_file():
            value = read_json(extra).get("eos_token_id")
            for tid in value if isinstance(value, list) else [value]:
                if isinstance(tid, int) and tid not in eos_ids:
                    eos_ids.append(tid)
    return HFTokenizer(
        tokenizer=tokenizer,
        bos_token=bos,
        eos_token=eos,
        pad_token=pad,
        bos_token_id=tokenizer.token_to_id(bos) if bos else None,
        eos_token_ids=eos_ids,
        chat_template=template,
    )
