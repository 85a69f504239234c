"""The Grafana dashboards (and KEDA's trigger) query metric names a real engine exports.

A tiny random Llama with multi-LoRA on serves one request; its `/metrics` text (the engine's
own registry: engine, LoRA and cold-start metrics) is the list of names that exist."""

from __future__ import annotations

import json
import os
import re

import pytest
from support.infra import TERRAFORM, all_docs

os.environ.setdefault("HF_HUB_OFFLINE", "1")

from prometheus_client.parser import text_string_to_metric_families  # noqa: E402

from loraplex.bench._synthetic.models import save_tiny_model  # noqa: E402

DASHBOARDS = sorted((TERRAFORM / "modules" / "observability" / "dashboards").glob("*.json"))
NAME = re.compile(r"\b(loraplex[:_][a-zA-Z0-9_:]+)")
SUFFIXES = {"counter": ("_total",), "histogram": ("_bucket", "_sum", "_count"), "gauge": ("",)}


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> set[str]:
    from loraplex.platform.engine import LLM, SamplingParams

    path = tmp_path_factory.mktemp("tiny")
    save_tiny_model(path, "llama", seed=1)
    llm = LLM(str(path), max_loras=2, max_lora_rank=8)
    assert llm.core.lora_runtime is not None
    llm.generate([[5, 6, 7, 8]], SamplingParams(max_tokens=3, temperature=0.0, ignore_eos=True))
    names: set[str] = set()
    for family in text_string_to_metric_families(llm.core.metrics.render().decode()):
        names |= {family.name + s for s in SUFFIXES.get(family.type, ("",))}
    return names


def _exprs() -> list[str]:
    out = []
    for path in DASHBOARDS:
        dash = json.loads(path.read_text())
        for panel in dash["panels"]:
            out += [t["expr"] for t in panel.get("targets", [])]
        out += [v["query"]["query"] for v in dash["templating"]["list"] if v["type"] == "query"]
    return out


def test_dashboards_cover_what_operators_watch() -> None:
    assert DASHBOARDS
    titles = {p["title"] for path in DASHBOARDS for p in json.loads(path.read_text())["panels"]}
    for wanted in ("TTFT p95", "ITL p95", "Tokens/s", "KV cache use", "Resident adapters per replica",
                   "Cold start, wall time to ready"):  # fmt: skip
        assert wanted in titles
    assert any("num_requests_waiting" in e for e in _exprs())


def test_every_metric_queried_is_one_the_engine_exports(exported: set[str]) -> None:
    assert {"loraplex:time_to_first_token_seconds_bucket", "loraplex:lora_adapter_resident",
            "loraplex:cold_start_phase_seconds"} <= exported  # fmt: skip
    queried = {n for e in _exprs() for n in NAME.findall(e)}
    keda = [d["spec"]["triggers"][0]["metadata"]["query"] for d in all_docs()
            if d["kind"] == "ScaledObject"]  # fmt: skip
    queried |= {n for q in keda for n in NAME.findall(q)}
    assert len(queried) >= 15
    assert queried <= exported, sorted(queried - exported)


def _rules(env: str = "dev") -> list[dict]:
    from support.infra import rendered

    docs = [d for d in rendered()[f"{env}/platform.yaml"] if d["kind"] == "PrometheusRule"]
    assert docs, "no PrometheusRule"
    return [r for d in docs for g in d["spec"]["groups"] for r in g["rules"]]


def test_alerts_page_for_what_operators_are_paged_for(exported: set[str]) -> None:
    """No live replica for a deployment, errors, TTFT p95 over the SLO, KV use at the limit,
    the validation backlog;
    every loraplex metric a rule reads is one the engine exports; the rules are valid for
    the Prometheus Operator's schema."""
    from support.infra import rendered, validate_resource

    for env in ("dev", "prod"):
        for d in rendered()[f"{env}/platform.yaml"]:
            if d["kind"] == "PrometheusRule":
                validate_resource(d)
    rules = {r["alert"]: r for r in _rules()}
    for wanted in ("LoraplexDeploymentNoLiveReplica", "LoraplexEngineErrorRate",
                   "LoraplexTTFTp95OverSLO", "LoraplexKVCacheFull"):  # fmt: skip
        assert wanted in rules, sorted(rules)
        assert rules[wanted]["labels"]["severity"] in ("page", "ticket")
        assert rules[wanted]["annotations"]["summary"]
    # The validation backlog is the API's (read from the database; the metric's own test is
    # tests/api/test_validation_backlog_metrics.py): its names come from the same registry.
    from prometheus_client import generate_latest

    from loraplex.platform.services.validation_backlog import ValidationBacklog

    api_text = generate_latest(ValidationBacklog(None).registry).decode()  # type: ignore[arg-type]
    api = {f.name for f in text_string_to_metric_families(api_text)}
    assert "LoraplexValidationBacklog" in rules
    queried = {n for r in rules.values() for n in NAME.findall(r["expr"])}
    assert queried and queried <= exported | api, sorted(queried - exported - api)
    from support.infra import release

    slo = release("dev").values["alerts"]["ttft_p95_slo_s"]
    assert f"> {slo}" in rules["LoraplexTTFTp95OverSLO"]["expr"]


def test_certificate_expiry_is_alarmed() -> None:
    """The API certificate's DaysToExpiry (ACM's CloudWatch metric) has an alarm."""
    text = "\n".join(p.read_text() for p in (TERRAFORM / "stack").glob("*.tf"))
    assert re.search(r'resource "aws_cloudwatch_metric_alarm" "certificate_expiry"', text)
    assert '"AWS/CertificateManager"' in text and '"DaysToExpiry"' in text
    assert "CertificateArn = var.api_certificate_arn" in text


def test_gpu_telemetry_is_scraped_and_on_the_dashboard() -> None:
    """NVIDIA's dcgm-exporter runs on the GPU nodes (a pinned chart, scraped through its
    ServiceMonitor), and the dashboard plots its GPU utilization and memory."""
    text = (TERRAFORM / "modules" / "observability" / "main.tf").read_text()
    assert re.search(r'resource "helm_release" "dcgm_exporter"', text)
    assert 'var.chart_versions["dcgm-exporter"]' in text
    assert "serviceMonitor" in text and "nvidia.com/gpu" in text
    exprs = " ".join(_exprs())
    for metric in ("DCGM_FI_DEV_GPU_UTIL", "DCGM_FI_DEV_FB_USED"):
        assert metric in exprs, metric
    for env in ("dev", "prod"):
        envtext = (TERRAFORM / "envs" / env / "main.tf").read_text()
        assert re.search(r'"dcgm-exporter"\s*=\s*"[0-9]+\.[0-9]+\.[0-9]+"', envtext), env
