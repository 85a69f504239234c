"""What the workloads read matches what Terraform outputs and what the platform's Settings
accept: every `tf.X` a template reads is an output of every environment, every LORAPLEX_*
variable the workloads set is a Settings field, and each workload sets what it needs."""

from __future__ import annotations

from support.infra import (
    ENVS,
    TERRAFORM,
    all_docs,
    blocks,
    example_outputs,
    pod_spec,
    template_references,
)

from loraplex.platform.settings import Settings

PREFIX = "LORAPLEX_"


def test_every_value_the_templates_read_is_an_output_of_every_env() -> None:
    used = template_references("tf")
    assert {"bucket_name", "database_address", "redis_address", "service_account_role_arns"} <= used
    for env in ENVS:
        outputs = set(blocks(TERRAFORM / "envs" / env, "output"))
        assert used <= outputs, (env, used - outputs)
    # The example operators render against has exactly the outputs' names.
    assert set(example_outputs()) == set(blocks(TERRAFORM / "envs" / "dev", "output"))


def _config(kind: str, name: str) -> set[str]:
    """Keys a ConfigMap sets, or an ExternalSecret puts into its target Secret."""
    for d in all_docs():
        if d["kind"] == "ConfigMap" and kind == "configMapRef" and d["metadata"]["name"] == name:
            return set(d["data"])
        if (
            d["kind"] == "ExternalSecret"
            and kind == "secretRef"
            and d["spec"]["target"]["name"] == name
        ):
            return set(d["spec"]["target"]["template"]["data"])
    raise AssertionError(f"no {kind} {name}")


def _workload_env() -> dict[str, set[str]]:
    """LORAPLEX_* variables each container receives, by `<workload>/<container>`."""
    out: dict[str, set[str]] = {}
    for d in all_docs():
        spec = pod_spec(d)
        if spec is None:
            continue
        for c in spec["containers"]:
            names = {e["name"] for e in c.get("env", [])}
            for src in c.get("envFrom", []):
                [(kind, ref)] = src.items()
                names |= _config(kind, ref["name"])
            key = f"{d['metadata']['labels']['app.kubernetes.io/name']}/{c['name']}"
            out.setdefault(key, set()).update(n for n in names if n.startswith(PREFIX))
    return out


def test_every_loraplex_variable_set_is_a_settings_field() -> None:
    fields = {PREFIX + f.upper() for f in Settings.model_fields}
    env = _workload_env()
    assert env
    for workload, names in env.items():
        assert names <= fields, (workload, names - fields)


# What each process reads to run outside `loraplex up` (which otherwise starts embedded
# services and fills these in), and the switch that makes boto3 use the pod's IRSA role.
REQUIRED = {
    "loraplex-api/api": {"database_url", "broker_url", "redis_url", "admin_key", "s3_endpoint_url",
                         "s3_bucket", "s3_region", "s3_static_credentials", "host", "port",
                         "replica_secret"},
    "loraplex-worker/worker": {"database_url", "broker_url", "s3_endpoint_url", "s3_bucket",
                               "s3_region", "s3_static_credentials"},
    "loraplex-migrate/migrate": {"database_url"},
    "loraplex-launcher/launcher": {"database_url"},
    "loraplex-engine/engine": {"s3_endpoint_url", "s3_bucket", "s3_region", "s3_static_credentials",
                               "replica_secret", "weights_cache_dir", "weights_cache_max_bytes"},
    "loraplex-engine/replica-agent": {"redis_url"},
    "loraplex-models/admin": {"database_url", "s3_endpoint_url", "s3_bucket", "s3_region",
                              "s3_static_credentials"},
}  # fmt: skip


def test_every_required_setting_is_set() -> None:
    # Every service the platform would otherwise start embedded is in some REQUIRED set.
    embedded = {
        n for n, f in Settings.model_fields.items() if f.default is None and not f.default_factory
    }
    # None means: no quota; the vLLM peer is a bench-only Python; no loop-stall log.
    optional = {"monthly_token_quota", "peer_vllm_python", "loop_stall_log_ms"}
    assert embedded - optional <= set().union(*REQUIRED.values())
    env = _workload_env()
    assert set(env) == set(REQUIRED)
    for workload, needs in REQUIRED.items():
        missing = {PREFIX + n.upper() for n in needs} - env[workload]
        assert not missing, (workload, missing)


def test_the_settings_the_workloads_set_parse() -> None:
    """The non-secret values themselves are what Settings accepts."""
    values: dict[str, str] = {}
    for d in all_docs():
        if d["kind"] == "ConfigMap":
            values.update(d["data"])
    settings = Settings(**{k[len(PREFIX) :].lower(): v for k, v in values.items()})
    assert settings.s3_static_credentials is False and settings.s3_credentials() == {}
    assert settings.port == 8000 and settings.s3_endpoint_url.startswith("https://s3.")
