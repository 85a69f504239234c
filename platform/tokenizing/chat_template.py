"""Chat templates: render a conversation to the prompt text a model was trained on.

Where the template comes from (one precedence, for the engine and the gateway alike):

1. `chat_template.jinja` in the model folder (what `transformers` saves, and prefers);
2. `chat_template` in `tokenizer_config.json`: a string, or a list of named templates where
   `default` wins (else the first);
3. `DEFAULT_CHAT_TEMPLATE` (ChatML, the format most open chat models use):

       {bos}<|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n

Every template renders in one environment: Jinja2's immutable sandbox (a template from an
untrusted upload cannot reach Python internals or mutate its inputs), with `trim_blocks`,
`lstrip_blocks`, loop controls, and the helpers HF templates use (`raise_exception`,
`strftime_now`, `tojson`).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)
TEMPLATE_FILE = "chat_template.jinja"
MAX_TEMPLATE_CHARS = 256 * 1024


class TemplateRenderError(ValueError):
    """The template refused the conversation (e.g. `raise_exception` on role order)."""

    def __init__(self, message: str) -> None:
        super().__init__(f"Chat template error: {message}")
        self.message = str(self)


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _environment() -> ImmutableSandboxedEnvironment:
    env = ImmutableSandboxedEnvironment(
        trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
    )
    env.filters["tojson"] = _tojson
    env.globals["raise_exception"] = _raise_exception
    env.globals["strftime_now"] = _strftime_now
    return env


_ENV = _environment()


class ChatTemplate:
    """A compiled, sandboxed chat template plus the special tokens it may reference."""

    def __init__(
        self, source: str, bos_token: str | None = None, eos_token: str | None = None
    ) -> None:
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ValueError("chat template is too large")
        self.source = source
        self.is_default = source == DEFAULT_CHAT_TEMPLATE
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = _ENV.from_string(source)

    def render(
        self,
        messages: Sequence[dict[str, Any]],
        add_generation_prompt: bool = True,
        **extra: Any,
    ) -> str:
        """Render `messages` (`{"role", "content"}` dicts) to prompt text.

        `extra` reaches the template as variables (`tools`, `documents`, ...; None unless
        given). Raises `TemplateRenderError` when the template refuses the conversation."""
        variables = {"tools": None, "documents": None, **extra}
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                **variables,
            )
        except TemplateError as exc:
            raise TemplateRenderError(str(exc)) from None
        except (TypeError, ValueError, KeyError, AttributeError) as exc:
            raise TemplateRenderError(f"{type(exc).__name__}: {exc}") from None


def _pick_template(value: Any) -> str | None:
    if isinstance(value, str):
        return value
    if isinstance(value, list):
        named = {t.get("name"): t.get("template") for t in value if isinstance(t, dict)}
        chosen = named.get("default") or next(iter(named.values()), None)
        return chosen if isinstance(chosen, str) else None
    return None


def load_chat_template(
    folder: Path, tokenizer_config: dict[str, Any], bos_token: str | None, eos_token: str | None
) -> ChatTemplate:
    """The template of the model in `folder` by the precedence above."""
    jinja_path = folder / TEMPLATE_FILE
    source = jinja_path.read_text(encoding="utf-8") if jinja_path.is_file() else None
    if source is None:
        source = _pick_template(tokenizer_config.get("chat_template"))
    return ChatTemplate(source or DEFAULT_CHAT_TEMPLATE, bos_token, eos_token)
