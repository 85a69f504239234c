"""Helpers for the gateway tests: a tiny real byte-level BPE tokenizer folder built in code."""

from __future__ import annotations

import json
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

CORPUS = [
    "Hello world, this is a tiny tokenizer for the gateway tests.",
    "The quick brown fox jumps over the lazy dog. END of story!",
    "Stop here: STOP. Then continue with more words and numbers 0123456789.",
    "Ünïcödé snowman ☃ and emoji 🙂 make bytes span tokens.",
]


def make_model_dir(path: Path, chat_template: str | None = None, context_length: int = 128) -> Path:
    """Write tokenizer.json, tokenizer_config.json and config.json to `path`."""
    path.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<s>", "</s>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
    )
    tok.train_from_iterator(CORPUS * 4, trainer)
    tok.post_processor = processors.TemplateProcessing(
        single="<s> $A", special_tokens=[("<s>", tok.token_to_id("<s>"))]
    )
    tok.save(str(path / "tokenizer.json"))
    cfg: dict = {"bos_token": "<s>", "eos_token": {"content": "</s>"}}
    if chat_template is not None:
        cfg["chat_template"] = chat_template
    (path / "tokenizer_config.json").write_text(json.dumps(cfg))
    (path / "config.json").write_text(
        json.dumps({"max_position_embeddings": context_length, "eos_token_id": 1})
    )
    return path


def fresh_database(pg_url: str, prefix: str = "gw") -> str:
    """Create an empty database next to `pg_url`'s, migrate it to head, return its URL."""
    import uuid

    import psycopg
    from sqlalchemy.engine import make_url

    from loraplex.platform.db.migrate import upgrade

    url = make_url(pg_url)
    name = f"{prefix}_{uuid.uuid4().hex[:10]}"
    admin = url.set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    new_url = url.set(database=name).render_as_string(hide_password=False)
    upgrade(new_url)
    return new_url


def seed_catalog(session, base_name: str = "tiny-base", share_prefix_cache: bool = False):
    """A base model row (files under models/NAME/) and a deployment serving it."""
    import uuid

    from loraplex.platform.db.models import BaseModel, Deployment

    base = BaseModel(
        id=uuid.uuid4(),
        name=base_name,
        family="dense",
        object_prefix=f"models/{base_name}/",
        config={},
    )
    session.add(base)
    session.flush()
    dep = Deployment(
        id=uuid.uuid4(),
        name=f"{base_name}-dep",
        base_model_id=base.id,
        weight_quantization="fp32",
        kv_cache_dtype="auto",
        max_loras=4,
        max_lora_rank=16,
        replicas=1,
        expert_parallel_size=1,
        share_prefix_cache=share_prefix_cache,
    )
    session.add(dep)
    session.flush()
    return base, dep


def add_adapter_version(session, tenant_id, base, name: str, status: str = "ready"):
    """An adapter NAME (created if needed) with one more version in `status`."""
    import hashlib
    import uuid

    from sqlalchemy import func, select

    from loraplex.platform.db.models import Adapter, AdapterVersion

    adapter = session.execute(
        select(Adapter).where(Adapter.tenant_id == tenant_id, Adapter.name == name)
    ).scalar_one_or_none()
    if adapter is None:
        adapter = Adapter(id=uuid.uuid4(), tenant_id=tenant_id, name=name, base_model_id=base.id)
        session.add(adapter)
        session.flush()
    n = (
        session.execute(
            select(func.max(AdapterVersion.n)).where(AdapterVersion.adapter_id == adapter.id)
        ).scalar()
        or 0
    ) + 1
    version = AdapterVersion(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        adapter_id=adapter.id,
        n=n,
        object_prefix=f"tenants/{tenant_id}/adapters/{adapter.id}/v{n}/",
        status=status,
        sha256=hashlib.sha256(f"{adapter.id}:{n}".encode()).hexdigest()
        if status == "ready"
        else None,
    )
    session.add(version)
    session.flush()
    return adapter, version
