"""A running control plane for the operator CLI tests: this module's own database, bucket
and queue; the demo model registered as a base model; a real Celery worker; the API app
under uvicorn as `loraplex up` starts it."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from support.control_plane import control_plane, running_worker
from support.gateway_stack import Api, settings_env
from support.opcli import OperatorShell

BASE_MODEL = "demo"
# The adapter rank limit without a deployment (Settings.default_max_lora_rank): high, so a
# 64 MiB adapter of the small demo model is still valid.
RANK_LIMIT = 1024


@dataclass
class OpStack:
    """What the tests drive: the API URL, the settings behind it, the demo model folder."""

    url: str
    settings: Any
    model_dir: Path
    base_model: str

    def shell(self, api_key: str | None = None) -> OperatorShell:
        """An operator shell for this stack (with a tenant key when given)."""
        return OperatorShell(self.url, self.settings.admin_key, api_key)


@pytest.fixture(scope="module")
def demo_model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The demo model folder (`loraplex models demo`)."""
    from loraplex.platform.demo_model import make_demo_model

    return make_demo_model(tmp_path_factory.mktemp("demo-model"))


@pytest.fixture(scope="module")
def op_stack(
    pg_url: str,
    settings: Any,
    s3_client: Any,
    demo_model_dir: Path,
    tmp_path_factory: pytest.TempPathFactory,
    request: pytest.FixtureRequest,
) -> Iterator[OpStack]:
    """The API and a worker over a fresh control plane with the demo model registered."""
    from loraplex.platform.services.base_models import register_base_model

    work = tmp_path_factory.mktemp("opcli")
    label = request.module.__name__
    with control_plane(pg_url, settings, s3_client, label, default_max_lora_rank=RANK_LIMIT) as s:
        register_base_model(s, BASE_MODEL, demo_model_dir)
        with running_worker(s):
            api = Api(settings_env(s), work)
            try:
                yield OpStack(api.url, s, demo_model_dir, BASE_MODEL)
            finally:
                api.stop()
