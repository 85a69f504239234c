"""The running stack the OpenAI gateway tests drive: the API under uvicorn, a real engine
replica of the demo model, PostgreSQL, S3 and Redis; an offline engine of the same model."""

from __future__ import annotations

import uuid
from typing import Any

import openai
import pytest

from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.demo_model import make_demo_model
from loraplex.platform.engine.llm import LLM
from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.services.api_keys import create_api_key
from loraplex.platform.services.auth_events import install_commit_hook
from loraplex.platform.services.base_models import register_base_model
from loraplex.platform.services.deployments import DeploymentSpec, create_deployment
from loraplex.platform.services.tenants import create_tenant
from support.control_plane import fresh_database
from support.gateway_stack import Api, Replica, settings_env


class Stack:
    """What the tests need to reach the running stack."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def client(self, key: str | None = None, **kw: Any) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.api.url}/v1",
            api_key=key or self.key_a,
            max_retries=0,
            timeout=60,
            **kw,
        )


@pytest.fixture(scope="module")
def stack(pg_url: str, settings: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("gwstack")
    db_url = fresh_database(pg_url)
    tag = uuid.uuid4().hex[:8]
    s = settings.model_copy(
        update={
            "database_url": db_url,
            "data_dir": work / "data",
            "stream_stall_timeout_s": 5.0,
            "rate_limit_rpm": 100_000,
        }
    )
    # This process changes keys through the services directly (as the API does): revocations
    # bump the auth generation the API's key cache reads, as they do from the API's process.
    install_commit_hook(s)
    model_dir = make_demo_model(work / "demo")
    base_name, dep_name = f"demo-{tag}", f"demo-dep-{tag}"
    register_base_model(s, base_name, model_dir)
    factory = make_sessionmaker(db_url)
    with session_scope(factory) as session:
        create_deployment(
            session,
            s,
            DeploymentSpec(
                name=dep_name,
                base_model=base_name,
                weight_quantization="fp32",
                max_loras=4,
                max_lora_rank=16,
            ),
        )
        ta, tb = create_tenant(session, f"acme-{tag}"), create_tenant(session, f"globex-{tag}")
        _, key_a = create_api_key(session, ta.id, "a")
        _, key_b = create_api_key(session, tb.id, "b")
        ids = (ta.id, tb.id)
    # Replicas get the settings too: they fetch adapters from the same object store.
    replica = Replica(model_dir, dep_name, redis_url, work, env=settings_env(s, "engine"))
    api = Api(settings_env(s), work)
    st = Stack(
        api=api,
        replica=replica,
        settings=s,
        factory=factory,
        model_dir=model_dir,
        base=base_name,
        deployment=dep_name,
        key_a=key_a,
        key_b=key_b,
        tenant_a=ids[0],
        tenant_b=ids[1],
        redis_url=redis_url,
        work=work,
        assets=ModelAssets.load(model_dir),
    )
    try:
        yield st
    finally:
        api.stop()
        replica.stop()


@pytest.fixture(scope="module")
def offline(stack: Stack) -> LLM:
    return LLM(str(stack.model_dir))


def chat_prompt_ids(stack: Stack, messages: list[dict[str, str]]) -> list[int]:
    text = stack.assets.tokenizer.apply_chat_template(messages, add_generation_prompt=True)
    return stack.assets.tokenizer.encode(text, add_special_tokens=False)
