"""Quantized deployments end to end: each weight choice (int8, int4, int4_sym, fp8; with the fp8 KV cache
on one) created through the admin API, its replica started from the deployment row's engine
options, serves a tenant's uploaded adapter through the gateway exactly as the offline engine
with the same choices does; `/v1/models` and the replica's `/state` show the quantization."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select
from support.control_plane import fresh_database
from support.gateway_clients import MESSAGES
from support.gateway_stack import Api, Replica, settings_env
from support.peft_adapters import make_peft_adapter

from loraplex.bench._synthetic.models import save_tiny_model
from loraplex.bench.serve_stack import upload_and_wait
from loraplex.platform.db.models import Deployment
from loraplex.platform.db.session import make_sessionmaker, session_scope
from loraplex.platform.engine.llm import LLM
from loraplex.platform.engine.sampling_params import SamplingParams
from loraplex.platform.engine_spec import engine_args, engine_config_for_deployment
from loraplex.platform.gateway.assets import ModelAssets
from loraplex.platform.local_processes import start_worker_process
from loraplex.platform.services.api_keys import create_api_key
from loraplex.platform.services.base_models import register_base_model
from loraplex.platform.services.tenants import create_tenant

pytestmark = [pytest.mark.timeout(900), pytest.mark.gateway_adapters]

# widths in whole int4 groups of 128 (the tiny default, 64, is refused for int4)
SIZES = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, num_key_value_heads=2)
CHOICES = {"int8": "auto", "int4": "fp8", "int4_sym": "auto", "fp8": "auto"}


class QuantStack:
    """The running stack: API, worker, one base model + deployment + replica per choice."""

    def __init__(self, **kw: Any) -> None:
        self.__dict__.update(kw)

    def client(self) -> openai.OpenAI:
        return openai.OpenAI(
            base_url=f"{self.api.url}/v1", api_key=self.key, max_retries=0, timeout=120
        )


def _replica_args(row: Deployment, model_dir: Path) -> list[str]:
    """The deployment's engine options (the one row -> EngineConfig mapping), less --model."""
    args = engine_args(engine_config_for_deployment(row, model=str(model_dir)))
    i = args.index("--model")
    return args[:i] + args[i + 2 :]


@pytest.fixture(scope="module")
def qstack(pg_url: str, settings: Any, redis_url: str, tmp_path_factory: pytest.TempPathFactory):
    work = tmp_path_factory.mktemp("qstack")
    db_url = fresh_database(pg_url)
    s = settings.model_copy(
        update={"database_url": db_url, "data_dir": work / "data", "rate_limit_rpm": 100_000}
    )
    model_dir = work / "base"
    save_tiny_model(model_dir, "llama", seed=4, **SIZES)
    tag = uuid.uuid4().hex[:8]
    factory = make_sessionmaker(db_url)
    with session_scope(factory) as session:
        tenant = create_tenant(session, f"q-{tag}")
        _, key = create_api_key(session, tenant.id, "k")
    api = Api(settings_env(s), work)
    worker = start_worker_process(settings_env(s, "worker"), work / "worker.log")
    admin = {"Authorization": f"Bearer {s.admin_key}"}
    bases, replicas = {}, {}
    try:
        for weights, kv in CHOICES.items():
            base = bases[weights] = f"q{weights}-{tag}"
            register_base_model(s, base, model_dir)
            body = {"name": f"{base}-dep", "base_model": base, "max_loras": 2,
                    "max_lora_rank": 16, "quantization": {"weights": weights, "kv_cache": kv}}  # fmt: skip
            r = httpx.post(f"{api.url}/admin/v1/deployments", headers=admin, json=body, timeout=30)
            assert r.status_code == 201, r.text
            assert r.json()["quantization"] == {"weights": weights, "kv_cache": kv}
            with session_scope(factory) as session:
                row = session.scalars(select(Deployment).where(Deployment.name == body["name"]))
                args = _replica_args(row.one(), model_dir)
            replicas[weights] = Replica(
                model_dir, body["name"], redis_url, work, extra_args=args,
                env=settings_env(s, "engine"),
            )  # fmt: skip
        yield QuantStack(api=api, key=key, bases=bases, replicas=replicas, work=work,
                         model_dir=model_dir, assets=ModelAssets.load(model_dir))  # fmt: skip
    finally:
        for replica in replicas.values():
            replica.stop()
        worker.stop()
        api.stop()


@pytest.mark.parametrize("weights", list(CHOICES))
def test_quantized_deployment_serves_an_adapter_through_the_gateway(
    qstack: QuantStack, weights: str
) -> None:
    kv = CHOICES[weights]
    name = f"ad-{weights}"
    folder = make_peft_adapter(qstack.model_dir, qstack.work / name, seed=3)
    upload_and_wait(qstack.api.url, qstack.key, qstack.bases[weights], name, folder, 180)
    tok = qstack.assets.tokenizer
    ids = tok.encode(
        tok.apply_chat_template(MESSAGES, add_generation_prompt=True), add_special_tokens=False
    )
    offline = LLM(str(qstack.model_dir), quantization=weights, dtype="bfloat16",
                  kv_cache_dtype=kv, max_loras=2, max_lora_rank=16)  # fmt: skip
    params = SamplingParams(temperature=0, max_tokens=10)
    ref = offline.generate([ids], params, adapters=[str(folder)])[0]
    base_ref = offline.generate([ids], params)[0]
    assert ref.token_ids != base_ref.token_ids, "the adapter must change the output"
    resp = qstack.client().chat.completions.create(
        model=name, messages=MESSAGES, max_tokens=10, temperature=0
    )
    assert resp.choices[0].message.content == tok.decode(ref.token_ids)
    state = qstack.replicas[weights].state()
    assert (state["weight_quantization"], state["kv_cache_dtype"]) == (weights, kv)
    assert 0 < state["weight_bytes"] == offline.core.weight_bytes
    assert state["kv_cache_bytes"] > 0 and state["num_blocks"] > 0
    listed = {m.id: m for m in qstack.client().models.list().data}
    want = [{"name": f"{qstack.bases[weights]}-dep",
             "quantization": {"weights": weights, "kv_cache": kv},
             "deterministic": False, "speculative": None}]  # fmt: skip
    assert listed[qstack.bases[weights]].model_extra["deployments"] == want
    assert listed[name].model_extra["deployments"] == want
