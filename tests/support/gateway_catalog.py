"""Catalog rows and model assets for the gateway tests: a base model + deployment
(`seed_catalog`), adapter versions (`add_adapter_version`), and a tokenizer-only model
folder with a tiny real byte-level BPE tokenizer built in code (`make_model_dir`)."""

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


def add_adapter_version(
    session,
    tenant_id,
    base,
    name: str,
    status: str = "ready",
    object_prefix: str | None = None,
    sha256: str | None = None,
):
    """An adapter NAME over `base` (a BaseModel row or its name; created if needed) with one
    more version in `status` (no files behind it unless `object_prefix` has them)."""
    import hashlib
    import uuid

    from sqlalchemy import func, select

    from loraplex.platform.db.models import Adapter, AdapterVersion, BaseModel

    if isinstance(base, str):
        base = session.execute(select(BaseModel).where(BaseModel.name == base)).scalar_one()
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
    prefix = object_prefix or f"tenants/{tenant_id}/adapters/{adapter.id}/v{n}/"
    ready = status == "ready"
    version = AdapterVersion(
        id=uuid.uuid4(),
        tenant_id=tenant_id,
        adapter_id=adapter.id,
        n=n,
        object_prefix=prefix,
        status=status,
        sha256=(sha256 or hashlib.sha256(prefix.encode()).hexdigest()) if ready else None,
    )
    session.add(version)
    session.flush()
    return adapter, version
