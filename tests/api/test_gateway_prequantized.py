"""AWQ and GPTQ (act-order) bases end to end: the checkpoint packed by AutoAWQ / AutoGPTQ is
registered, a deployment created through the admin API with weights `awq` / `gptq` (other
choices refused with the reason, nothing half-written), its replica started from the deployment
row's engine options serves a tenant's uploaded adapter through the gateway exactly as the
offline engine does."""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import httpx
import openai
import pytest
from sqlalchemy import select
from support.awq_gptq_checkpoints import libraries_installed, save_awq_gptq
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

pytestmark = [
    pytest.mark.timeout(900),
    pytest.mark.gateway_adapters,
    pytest.mark.skipif(not libraries_installed(), reason="AutoAWQ / AutoGPTQ (oracles) missing"),
]

# two int4 groups per input, so act-order really permutes the groups
SIZES = dict(hidden_size=256, intermediate_size=512, num_attention_heads=4, num_key_value_heads=2)


def _replica_args(row: Deployment, model_dir: Path) -> list[str]:
    """The deployment's engine options (the one row -> EngineConfig mapping), less --model."""
    args = engine_args(engine_config_for_deployment(row, model=str(model_dir)))
    i = args.index("--model")
    return args[:i] + args[i + 2 :]


def _post(api: Api, admin: dict, body: dict) -> httpx.Response:
    return httpx.post(f"{api.url}/admin/v1/deployments", headers=admin, json=body, timeout=30)


@pytest.mark.parametrize(("method", "variant"), [("gptq", "gptq_asym_act_order"), ("awq", "awq")])
def test_a_prequantized_deployment_serves_an_adapter_through_the_gateway(
    pg_url: str, settings: Any, redis_url: str, tmp_path: Path, method: str, variant: str
) -> None:
    db_url = fresh_database(pg_url)
    s = settings.model_copy(
        update={"database_url": db_url, "data_dir": tmp_path / "data", "rate_limit_rpm": 100_000}
    )
    plain_dir, quant_dir = tmp_path / "plain", tmp_path / method
    hf = save_tiny_model(plain_dir, "llama", seed=4, **SIZES)
    save_awq_gptq(hf, plain_dir, quant_dir, variant, seed=5)
    tag = uuid.uuid4().hex[:8]
    factory = make_sessionmaker(db_url)
    with session_scope(factory) as session:
        tenant = create_tenant(session, f"g-{tag}")
        _, key = create_api_key(session, tenant.id, "k")
    api = Api(settings_env(s), tmp_path)
    worker = start_worker_process(settings_env(s, "worker"), tmp_path / "worker.log")
    admin = {"Authorization": f"Bearer {s.admin_key}"}
    replica = None
    try:
        base, plain = f"{method}-{tag}", f"plain-{tag}"
        register_base_model(s, base, quant_dir)
        register_base_model(s, plain, plain_dir)
        refusals = [
            (base, "int4", f"pre-quantized ({method}) and fixes its own scheme; deploy it with "
                           f"weights {method}"),
            (plain, method, "stores plain (unquantized) weights; use int4"),
        ]  # fmt: skip
        for model, weights, why in refusals:
            body = {
                "name": f"bad-{weights}",
                "base_model": model,
                "quantization": {"weights": weights},
            }
            r = _post(api, admin, body)
            assert r.status_code == 400, r.text
            err = r.json()["error"]
            assert err["code"] == "unsupported_quantization" and why in err["message"], err
        listed = httpx.get(f"{api.url}/admin/v1/deployments", headers=admin, timeout=30).json()
        assert not {d["name"] for d in listed["data"]} & {"bad-int4", f"bad-{method}"}

        body = {"name": f"{base}-dep", "base_model": base, "max_loras": 2, "max_lora_rank": 16,
                "quantization": {"weights": method}}  # fmt: skip
        r = _post(api, admin, body)
        assert r.status_code == 201, r.text
        assert r.json()["quantization"] == {"weights": method, "kv_cache": "auto"}
        with session_scope(factory) as session:
            row = session.scalars(select(Deployment).where(Deployment.name == body["name"])).one()
            args = _replica_args(row, quant_dir)
        replica = Replica(quant_dir, body["name"], redis_url, tmp_path, extra_args=args,
                          env=settings_env(s, "engine"))  # fmt: skip

        # the adapter has the plain model's shapes, which are the quantized base's
        folder = make_peft_adapter(plain_dir, tmp_path / "ad", seed=3)
        upload_and_wait(api.url, key, base, f"ad-{method}", folder, 180)
        tok = ModelAssets.load(quant_dir).tokenizer
        ids = tok.encode(
            tok.apply_chat_template(MESSAGES, add_generation_prompt=True), add_special_tokens=False
        )
        offline = LLM(str(quant_dir), quantization=method, dtype="bfloat16", max_loras=2,
                      max_lora_rank=16)  # fmt: skip
        params = SamplingParams(temperature=0, max_tokens=10)
        ref = offline.generate([ids], params, adapters=[str(folder)])[0]
        assert ref.token_ids != offline.generate([ids], params)[0].token_ids
        client = openai.OpenAI(base_url=f"{api.url}/v1", api_key=key, max_retries=0, timeout=120)
        resp = client.chat.completions.create(
            model=f"ad-{method}", messages=MESSAGES, max_tokens=10, temperature=0
        )
        assert resp.choices[0].message.content == tok.decode(ref.token_ids)
        state = replica.state()
        assert state["weight_quantization"] == method
        assert 0 < state["weight_bytes"] == offline.core.weight_bytes
        models = {m.id: m for m in client.models.list().data}
        want = [
            {
                "name": body["name"],
                "quantization": {"weights": method, "kv_cache": "auto"},
                "deterministic": False,
                "speculative": None,
            }
        ]
        assert models[f"ad-{method}"].model_extra["deployments"] == want
    finally:
        if replica is not None:
            replica.stop()
        worker.stop()
        api.stop()
