"""What the infra tests share: the repository's infra/ tree parsed once (Terraform with
python-hcl2, the Kubernetes templates rendered for every environment)."""

from __future__ import annotations

import functools
import re
from pathlib import Path
from typing import Any

import hcl2
import yaml

from loraplex.infra.k8s.render import (
    OPERATOR,
    PRE_ROLLOUT,
    ROLLOUT,
    EngineSpec,
    Release,
    load_values,
    terraform_outputs,
)

REPO = Path(__file__).resolve().parents[2]
INFRA = REPO / "infra"
TERRAFORM = INFRA / "terraform"
ENVS = ("dev", "prod")
EXAMPLE_OUTPUTS = INFRA / "k8s" / "example-outputs.json"


def unq(value: Any) -> Any:
    """python-hcl2 keeps the quotes of string literals: `"x"` -> `x` (other values as they are)."""
    if isinstance(value, str) and len(value) >= 2 and value[0] == value[-1] == '"':
        return value[1:-1]
    return value


def fields(body: dict[str, Any]) -> dict[str, Any]:
    """A parsed block's or map's own entries (python-hcl2 adds `__is_block__` and the like)."""
    return {unq(k): v for k, v in body.items() if not str(k).startswith("__")}


@functools.cache
def tf_files() -> tuple[Path, ...]:
    return tuple(sorted(TERRAFORM.rglob("*.tf")))


@functools.cache
def parsed(path: Path) -> dict[str, Any]:
    with path.open() as f:
        return hcl2.load(f)


def blocks(folder: Path, kind: str) -> dict[str, dict[str, Any]]:
    """Every `kind` block (variable, output, module, ...) of a Terraform folder, by name."""
    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.tf")):
        for block in parsed(path).get(kind, []):
            out.update(fields(block))
    return out


def roots() -> list[Path]:
    """Every Terraform module folder (modules, the stack, the envs, bootstrap)."""
    return sorted({p.parent for p in tf_files()})


def folder_text(folder: Path) -> str:
    return "\n".join(p.read_text() for p in sorted(folder.glob("*.tf")))


@functools.cache
def example_outputs() -> dict[str, Any]:
    return terraform_outputs(EXAMPLE_OUTPUTS)


def release(env: str, tag: str = "v1.2.0") -> Release:
    return Release(example_outputs(), load_values(env), tag)


def example_engines() -> list[EngineSpec]:
    """A dense one-GPU deployment with LoRA and an expert-parallel one over a whole node."""
    return [
        EngineSpec(
            deployment="llama-8b",
            argv=(
                "--model",
                "s3://example-loraplex-dev/models/llama-8b/",
                "--max-loras",
                "8",
                "--quantization",
                "bf16",
            ),  # fmt: skip
            gpus=1,
            replicas=1,
            max_replicas=4,
            gpu_pool="a10g",
        ),
        EngineSpec(
            deployment="qwen3-moe",
            argv=("--model", "s3://example-loraplex-dev/models/qwen3-moe/", "--ep-size", "8"),
            gpus=8,
            replicas=2,
            max_replicas=2,
            gpu_pool="h100",
        ),
    ]


@functools.cache
def rendered_texts() -> dict[str, str]:
    """Every manifest text the repository can produce, by a readable name."""
    out: dict[str, str] = {}
    for env in ENVS:
        rel = release(env)
        out[f"{env}/platform.yaml"] = rel.platform(PRE_ROLLOUT + ROLLOUT)
        out[f"{env}/models-admin.yaml"] = rel.platform(OPERATOR)
        for spec in example_engines():
            out[f"{env}/engine-{spec.deployment}.yaml"] = rel.engine(spec)
    return out


def documents(text: str) -> list[dict[str, Any]]:
    return [d for d in yaml.safe_load_all(text) if d]


@functools.cache
def rendered() -> dict[str, list[dict[str, Any]]]:
    return {name: documents(text) for name, text in rendered_texts().items()}


def all_docs() -> list[dict[str, Any]]:
    return [d for docs in rendered().values() for d in docs]


def pod_spec(doc: dict[str, Any]) -> dict[str, Any] | None:
    """The pod spec of a workload resource (Deployment, Job, Pod), else None."""
    kind = doc["kind"]
    if kind in ("Deployment", "StatefulSet", "DaemonSet", "Job"):
        return doc["spec"]["template"]["spec"]
    if kind == "Pod":
        return doc["spec"]
    return None


def template_references(prefix: str) -> set[str]:
    """Names used as `<prefix>.NAME` across the Kubernetes templates (e.g. tf.bucket_name)."""
    pattern = re.compile(rf"\b{prefix}\.([a-z0-9_]+)")
    names: set[str] = set()
    for path in (INFRA / "k8s" / "templates").glob("*.j2"):
        names |= set(pattern.findall(path.read_text()))
    return names


def kubernetes_version() -> str:
    """The cluster's Kubernetes version (`x.y.0`), as every environment pins it."""
    versions = {unq(next(iter(blocks(TERRAFORM / "envs" / e, "module").values()))["kubernetes_version"])
                for e in ENVS}  # fmt: skip
    [version] = versions
    return f"{version}.0"


def validate_resource(doc: dict[str, Any]) -> None:
    """Raise unless `doc` is valid for the cluster's version (kubernetes-validate, strict) or,
    for a custom resource, for its CRD's schema (`crd_schemas`)."""
    import jsonschema
    import kubernetes_validate

    from support.crd_schemas import SCHEMAS

    key = (doc["apiVersion"], doc["kind"])
    if key in SCHEMAS:
        jsonschema.validate(doc, SCHEMAS[key])
    else:
        kubernetes_validate.validate(doc, kubernetes_version(), strict=True)
