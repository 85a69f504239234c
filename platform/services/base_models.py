"""Base models: upload a HuggingFace-layout folder to object storage and register it."""

from __future__ import annotations

import json
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sqlalchemy import select
from sqlalchemy.dialects.postgresql import insert
from sqlalchemy.orm import Session

from loraplex.platform.db.models import BaseModel
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.engine_spec.supported_models import (
    SUPPORTED_ARCHITECTURES,
    config_architectures,
    served_architecture,
)
from loraplex.platform.object_keys import MODELS, model_prefix
from loraplex.platform.settings import Settings

from . import audit, objects
from .errors import InvalidInput, NotFound
from .names import check_name

MAX_MODEL_NAME = 128
MAX_CONFIG_BYTES = 1 << 20


@dataclass(frozen=True)
class BaseModelInfo:
    """What registration returns: the row's id and what it recorded."""

    id: uuid.UUID
    name: str
    family: str
    object_prefix: str
    config: dict[str, Any]
    uploaded_files: int


def family_of(config: dict[str, Any]) -> str:
    """`dense` or `moe`, from the architecture the engine will build for `config`.

    Raises InvalidInput naming the supported architectures when the engine serves none of
    those the config lists, so a model no replica could load is never registered."""
    arch = served_architecture(config)
    if arch is None:
        named = config_architectures(config)
        raise InvalidInput(
            f"unsupported model architecture {', '.join(named) if named else '(none given)'} "
            f"in config.json; the engine serves: {', '.join(sorted(SUPPORTED_ARCHITECTURES))}",
            code="unsupported_architecture",
            param="architectures",
        )
    return SUPPORTED_ARCHITECTURES[arch]


def read_model_config(path: Path) -> dict[str, Any]:
    """Parse a model folder's config.json (InvalidInput if missing or not a JSON object)."""
    cfg_path = path / "config.json"
    if not cfg_path.is_file():
        raise InvalidInput(f"{path} has no config.json: not a HuggingFace model folder")
    if cfg_path.stat().st_size > MAX_CONFIG_BYTES:
        raise InvalidInput(f"{cfg_path} is larger than {MAX_CONFIG_BYTES} bytes")
    try:
        config = json.loads(cfg_path.read_text(encoding="utf-8"))
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(f"{cfg_path} is not valid JSON: {exc}") from exc
    if not isinstance(config, dict):
        raise InvalidInput(f"{cfg_path} must hold a JSON object")
    return config


def _model_files(path: Path) -> list[Path]:
    files = []
    for f in sorted(path.rglob("*")):
        rel = f.relative_to(path)
        if f.is_file() and not any(part.startswith(".") for part in rel.parts):
            files.append(f)
    return files


def _upload_folder(settings: Settings, path: Path, prefix: str) -> int:
    """Upload every file not already stored with the same size; returns how many were sent."""
    client = objects.s3_client(settings)
    sent = 0
    for f in _model_files(path):
        key = prefix + f.relative_to(path).as_posix()
        if objects.object_size(client, settings.s3_bucket, key) == f.stat().st_size:
            continue
        with f.open("rb") as fh:
            objects.put_file(client, settings.s3_bucket, key, fh)
        sent += 1
    return sent


def register_base_model(settings: Settings, name: str, path: str | Path) -> BaseModelInfo:
    """Upload the folder under `models/{name}/` and create or update its row (idempotent)."""
    check_name(name, "name", MAX_MODEL_NAME)
    folder = Path(path).expanduser()
    if not folder.is_dir():
        raise InvalidInput(f"{folder} is not a directory")
    config = read_model_config(folder)
    family = family_of(config)
    prefix = model_prefix(name)
    sent = _upload_folder(settings, folder, prefix)
    if not settings.database_url:
        raise RuntimeError("LORAPLEX_DATABASE_URL is not set")
    with session_scope(make_sessionmaker(settings.database_url)) as session:
        model_id = _upsert(session, name, family, prefix, config, actor="system",
                           detail={"files_uploaded": sent})  # fmt: skip
    return BaseModelInfo(model_id, name, family, prefix, config, sent)


def _upsert(
    session: Session,
    name: str,
    family: str,
    prefix: str,
    config: dict[str, Any],
    *,
    actor: str,
    detail: dict[str, Any],
) -> uuid.UUID:
    """Insert or update the base model row `name` and audit it; its id."""
    insert_row = insert(BaseModel).values(
        id=uuid.uuid4(), name=name, family=family, object_prefix=prefix, config=config
    )
    stmt = insert_row.on_conflict_do_update(
        index_elements=[BaseModel.name],
        set_={"family": family, "object_prefix": prefix, "config": config},
    ).returning(BaseModel.id)
    model_id = session.execute(stmt).scalar_one()
    audit.record(
        session,
        actor=actor,
        action="base_model.register",
        resource_type="base_model",
        resource_id=model_id,
        detail={"name": name, "family": family, **detail},
    )
    return model_id


def get_base_model(session: Session, name: str) -> BaseModel:
    """The base model registered under `name` (NotFound otherwise)."""
    model = session.scalars(select(BaseModel).where(BaseModel.name == name)).one_or_none()
    if model is None:
        raise NotFound(
            f"no base model named {name!r}", code="base_model_not_found", param="base_model"
        )
    return model


def list_base_models(session: Session) -> list[BaseModel]:
    """Every registered base model."""
    return list(session.scalars(select(BaseModel).order_by(BaseModel.name)))


def register_from_prefix(
    session: Session, settings: Settings, name: str, object_prefix: str, *, actor: str
) -> BaseModel:
    """Register a model whose files are already in the bucket under `object_prefix` (a folder
    under `models/` holding config.json and safetensors weights); updates an existing row."""
    check_name(name, "name", MAX_MODEL_NAME)
    prefix = (object_prefix or "").strip()
    prefix = prefix if prefix.endswith("/") else prefix + "/"
    root = MODELS.template.split("{")[0]  # "models/"
    if not prefix.startswith(root) or prefix == root or ".." in prefix:
        raise InvalidInput(
            "object_prefix must be a folder under models/ (e.g. models/llama-8b/)",
            code="invalid_prefix",
            param="object_prefix",
        )
    client = objects.s3_client(settings)
    keys = objects.list_keys(client, settings.s3_bucket, prefix)
    if prefix + "config.json" not in keys:
        raise InvalidInput(
            f"no config.json under {prefix}: not a HuggingFace model folder",
            code="model_files_missing",
            param="object_prefix",
        )
    if not any(k.endswith(".safetensors") for k in keys):
        raise InvalidInput(
            f"no .safetensors weights under {prefix}",
            code="model_files_missing",
            param="object_prefix",
        )
    try:
        raw = objects.read_all(client, settings.s3_bucket, prefix + "config.json", MAX_CONFIG_BYTES)
        config = json.loads(raw)
    except (ValueError, UnicodeDecodeError) as exc:
        raise InvalidInput(
            f"{prefix}config.json is not a JSON object under {MAX_CONFIG_BYTES} bytes",
            code="invalid_model_config",
            param="object_prefix",
        ) from exc
    if not isinstance(config, dict):
        raise InvalidInput(
            f"{prefix}config.json must hold a JSON object", code="invalid_model_config"
        )
    family = family_of(config)
    model_id = _upsert(session, name, family, prefix, config, actor=actor,
                       detail={"object_prefix": prefix})  # fmt: skip
    model = session.get(BaseModel, model_id, populate_existing=True)
    assert model is not None
    return model
