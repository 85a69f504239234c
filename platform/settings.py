"""The one `Settings` object: every knob of the platform, read from `LORAPLEX_*` env vars.

Build it once at the edge (CLI, app factory, worker) and pass it down; deep code never
reads the environment or a global.
"""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict


def default_data_dir() -> Path:
    """Where `loraplex up` keeps its databases and objects unless told otherwise."""
    return Path(platformdirs.user_data_dir("loraplex", appauthor=False))


class Settings(BaseSettings):
    """Platform configuration; a field left unset for a service means "start the embedded one"."""

    model_config = SettingsConfigDict(env_prefix="LORAPLEX_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)

    # Services. None -> `loraplex up` starts the embedded server and fills these in.
    database_url: str | None = None
    s3_endpoint_url: str | None = None
    s3_bucket: str = "loraplex"
    s3_access_key: str = "loraplex"
    s3_secret_key: str = "loraplex-secret"
    s3_region: str = "us-east-1"
    broker_url: str | None = None

    admin_key: str | None = None

    # API
    host: str = "127.0.0.1"
    port: int = 8000

    # Limits on what clients send.
    max_adapter_bytes: int = 512 * 1024 * 1024
    max_config_bytes: int = 64 * 1024
    max_safetensors_header_bytes: int = 16 * 1024 * 1024
    max_name_length: int = 64
    presign_expiry_s: int = 3600

    # Deployment defaults.
    default_max_loras: int = 8
    default_max_lora_rank: int = 64
