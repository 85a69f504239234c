"""Chat templates (`loraplex.platform.tokenizing`, one precedence for engine and gateway): the
model's own (chat_template.jinja, else tokenizer_config.json), the default, the sandbox; and
the gateway's per-model asset cache."""

from __future__ import annotations

from pathlib import Path

import pytest
from support.gateway_catalog import make_model_dir

from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.tokenizing import (
    DEFAULT_CHAT_TEMPLATE,
    ChatTemplate,
    TemplateRenderError,
    load_tokenizer,
)

LLAMA2_LIKE = (
    "{% for message in messages %}"
    "{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
    "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
    "{% endif %}"
    "{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + message['content'] | trim + ' [/INST]' }}"
    "{% else %}{{ ' ' + message['content'] | trim + ' ' + eos_token }}{% endif %}"
    "{% endfor %}"
)

MSGS = [
    {"role": "user", "content": "Hi"},
    {"role": "assistant", "content": "Hello"},
    {"role": "user", "content": "Bye"},
]


def test_model_template_from_tokenizer_config(tmp_path: Path) -> None:
    tpl = load_tokenizer(make_model_dir(tmp_path, chat_template=LLAMA2_LIKE)).template
    assert not tpl.is_default
    assert tpl.render(MSGS) == "<s>[INST] Hi [/INST] Hello </s><s>[INST] Bye [/INST]"


def test_named_template_list_picks_default(tmp_path: Path) -> None:
    tpl = load_tokenizer(
        make_model_dir(
            tmp_path,
            chat_template=[
                {"name": "tool_use", "template": "T"},
                {"name": "default", "template": "D{{ messages|length }}"},
            ],
        )
    ).template
    assert tpl.render(MSGS) == "D3"


def test_chat_template_jinja_file_wins(tmp_path: Path) -> None:
    model = make_model_dir(tmp_path, chat_template="from-config")
    (model / "chat_template.jinja").write_text("from-file")
    assert load_tokenizer(model).apply_chat_template(MSGS) == "from-file"


def test_default_template_when_model_has_none(tmp_path: Path) -> None:
    tpl = load_tokenizer(make_model_dir(tmp_path)).template
    assert tpl.is_default and tpl.source == DEFAULT_CHAT_TEMPLATE
    out = tpl.render([{"role": "system", "content": "S"}, {"role": "user", "content": "U"}])
    assert (
        out
        == "<s><|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
    )
    assert not tpl.render([{"role": "user", "content": "U"}], add_generation_prompt=False).endswith(
        "assistant\n"
    )
    # The rendered prompt tokenizes with the model's tokenizer.
    assets = ModelAssets.load(tmp_path)
    tok = assets.tokenizer
    assert tok.encode(out, add_special_tokens=False)[0] == tok.token_to_id("<s>")
    assert assets.context_length == 128 and tok.eos_token_ids == [1]


def test_raise_exception_is_a_400() -> None:
    tpl = ChatTemplate(LLAMA2_LIKE, "<s>", "</s>")
    with pytest.raises(TemplateRenderError) as info:
        tpl.render([{"role": "assistant", "content": "x"}])
    assert "alternate" in info.value.message


def test_sandbox_blocks_python_internals() -> None:
    tpl = ChatTemplate("{{ messages.__class__.__mro__[1].__subclasses__() }}")
    with pytest.raises(TemplateRenderError):
        tpl.render(MSGS)
    mutating = ChatTemplate("{{ messages.append(1) }}")
    with pytest.raises(TemplateRenderError):
        mutating.render(MSGS)


def test_asset_cache_loads_once_under_concurrency(tmp_path: Path) -> None:
    import threading
    import time

    from loraplex.platform.gateway.assets import AssetCache

    model = make_model_dir(tmp_path)
    calls: list[int] = []

    def locate() -> Path:
        calls.append(1)
        time.sleep(0.1)
        return model

    cache = AssetCache()
    got: list[ModelAssets] = []
    threads = [
        threading.Thread(target=lambda: got.append(cache.get("m", locate))) for _ in range(8)
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(calls) == 1 and len(got) == 8 and all(g is got[0] for g in got)
