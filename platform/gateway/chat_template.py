"""Chat templates: render a conversation to the prompt text a model was trained on.

The template comes from the model folder: `chat_template.jinja`, or `chat_template` in
`tokenizer_config.json` (a string, or a list of named templates where `default` wins).
It runs in Jinja2's immutable sandbox, so a template from an untrusted upload cannot
touch Python internals. When the model has no template, `DEFAULT_CHAT_TEMPLATE` is used:

    {bos}<|im_start|>{role}\\n{content}<|im_end|>\\n ... <|im_start|>assistant\\n

(ChatML, the format most open chat models use; the generation prompt opens the
assistant turn).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

from jinja2 import TemplateError
from jinja2.sandbox import ImmutableSandboxedEnvironment

from loraplex.platform.gateway.errors import GatewayError

DEFAULT_CHAT_TEMPLATE = (
    "{{ bos_token if bos_token else '' }}"
    "{% for message in messages %}"
    "<|im_start|>{{ message['role'] }}\n{{ message['content'] }}<|im_end|>\n"
    "{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)

MAX_TEMPLATE_CHARS = 256 * 1024


class TemplateRenderError(GatewayError):
    """The template refused the conversation (e.g. `raise_exception` on role order): a 400."""

    def __init__(self, message: str) -> None:
        super().__init__(
            400, f"Chat template error: {message}", param="messages", code="invalid_value"
        )


def _raise_exception(message: str) -> None:
    raise TemplateError(message)


def _tojson(value: Any, indent: int | None = None, ensure_ascii: bool = False, **_: Any) -> str:
    return json.dumps(value, indent=indent, ensure_ascii=ensure_ascii)


def _strftime_now(fmt: str) -> str:
    return datetime.now().strftime(fmt)


def _token_text(value: Any) -> str | None:
    """`bos_token` is a string or a serialized AddedToken (`{"content": ...}`)."""
    if isinstance(value, dict):
        value = value.get("content")
    return value if isinstance(value, str) else None


class ChatTemplate:
    """A compiled, sandboxed chat template plus the special tokens it may reference."""

    def __init__(
        self, source: str, bos_token: str | None = None, eos_token: str | None = None
    ) -> None:
        if len(source) > MAX_TEMPLATE_CHARS:
            raise ValueError("chat template is too large")
        env = ImmutableSandboxedEnvironment(
            trim_blocks=True, lstrip_blocks=True, extensions=["jinja2.ext.loopcontrols"]
        )
        env.filters["tojson"] = _tojson
        env.globals["raise_exception"] = _raise_exception
        env.globals["strftime_now"] = _strftime_now
        self.source = source
        self.is_default = source == DEFAULT_CHAT_TEMPLATE
        self.bos_token = bos_token
        self.eos_token = eos_token
        self._template = env.from_string(source)

    def render(self, messages: Sequence[dict[str, Any]], add_generation_prompt: bool = True) -> str:
        """Render `messages` (`{"role", "content"}` dicts) to prompt text; 400 on template errors."""
        try:
            return self._template.render(
                messages=list(messages),
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
                tools=None,
                documents=None,
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


def load_chat_template(model_dir: Path) -> ChatTemplate:
    """The template of the model in `model_dir`, or the documented default when it has none."""
    config: dict[str, Any] = {}
    config_path = model_dir / "tokenizer_config.json"
    if config_path.is_file():
        config = json.loads(config_path.read_text(encoding="utf-8"))
    source = None
    jinja_path = model_dir / "chat_template.jinja"
    if jinja_path.is_file():
        source = jinja_path.read_text(encoding="utf-8")
    if source is None:
        source = _pick_template(config.get("chat_template"))
    return ChatTemplate(
        source or DEFAULT_CHAT_TEMPLATE,
        bos_token=_token_text(config.get("bos_token")),
        eos_token=_token_text(config.get("eos_token")),
    )
