"""Render the platform's Kubernetes manifests from the Jinja templates beside this file.

Three inputs, nothing else: Terraform's outputs (`terraform output -json`: everything AWS
made), the environment's values (`values/<env>.yaml`: sizes and tunables) and the release
tag of the images. The engine template is rendered once per platform deployment from an
`EngineSpec`: operators use the `engine` command below; the control plane's Kubernetes
launcher calls `render_engine` with the spec it builds from the deployment row.

    python -m loraplex.infra.k8s.render --env dev --outputs tf.json --tag v1.2.0 platform
    python -m loraplex.infra.k8s.render --env dev --outputs tf.json --tag v1.2.0 \\
        engine --deployment llama-8b --gpus 1 --replicas 1 --max-replicas 4 --gpu-pool a10g \\
        -- --model s3://BUCKET/models/llama-8b/ --max-loras 8 --quantization bf16
"""

from __future__ import annotations

import argparse
import json
import re
import sys
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import jinja2
import yaml

HERE = Path(__file__).resolve().parent
TEMPLATES = HERE / "templates"
VALUES = HERE / "values"

# Applied before the rollout (the migration Job last: deploy.sh waits for it), then the rollout.
PRE_ROLLOUT = (
    "namespace",
    "service-accounts",
    "secrets",
    "settings",
    "weights-cache",
    "karpenter",
    "network-policies",
    "monitoring",
    "migrate",
)
ROLLOUT = ("api", "worker", "launcher")
OPERATOR = ("models-admin",)

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]{0,44}[a-z0-9])?$")
_QUANTITY = re.compile(r"^([0-9]+)(Ki|Mi|Gi|Ti)$")


@dataclass(frozen=True)
class EngineSpec:
    """What one platform deployment asks of Kubernetes; the rest is the environment's.

    `argv` is the engine's options as `EngineConfig` generates them for the deployment row
    (the same list `loraplex up` passes to a local replica), without `--host`/`--port`: the
    template binds the replica to its pod IP. `gpus` is the expert-parallel size (one pod
    holds all ranks). `replicas` is the floor KEDA keeps; above it up to `max_replicas`
    replicas are added on queue depth (equal: no autoscaling)."""

    deployment: str
    argv: tuple[str, ...]
    gpus: int = 1
    replicas: int = 1
    max_replicas: int = 1
    gpu_pool: str = ""

    def check(self, gpu_pools: dict[str, Any], *, scale_to_zero: bool = False) -> None:
        """Refuse a spec no cluster of these pools could run, or a floor of 0 where the
        environment does not scale from zero (ValueError)."""
        if not _DNS_LABEL.match(self.deployment):
            raise ValueError(
                f"deployment {self.deployment!r} is not a DNS label of at most 46 characters "
                "(lowercase letters, digits, dashes)"
            )
        if any(
            a in ("--host", "--port") or a.startswith(("--host=", "--port=")) for a in self.argv
        ):
            raise ValueError("argv must not bind the replica: the template sets --host/--port")
        if self.gpu_pool not in gpu_pools:
            raise ValueError(
                f"GPU pool {self.gpu_pool!r} does not exist; the cluster has: "
                f"{', '.join(sorted(gpu_pools)) or '(none)'}"
            )
        per_node = int(gpu_pools[self.gpu_pool]["gpus_per_node"])
        if not 1 <= self.gpus <= per_node:
            raise ValueError(
                f"{self.gpus} GPUs per replica cannot fit pool {self.gpu_pool!r} "
                f"({per_node} per node)"
            )
        if self.replicas < 0:
            raise ValueError("replicas must be >= 0")
        if self.replicas == 0 and not scale_to_zero:
            raise ValueError(
                "a floor of 0 replicas needs scale to zero, which this environment turns off "
                "(values engine.keda.scale_to_zero); keep at least one replica"
            )
        if self.replicas == 0 and self.max_replicas < 1:
            raise ValueError("a deployment scaled to zero needs max_replicas >= 1 to wake")
        if self.max_replicas < self.replicas:
            raise ValueError("max_replicas must be at least replicas")


def terraform_outputs(path: str | Path) -> dict[str, Any]:
    """The values of `terraform output -json` (each output's `value`)."""
    raw = json.loads(Path(path).read_text())
    return {name: out["value"] for name, out in raw.items()}


def load_values(env: str) -> dict[str, Any]:
    """The environment's workload values (`values/<env>.yaml`)."""
    path = VALUES / f"{env}.yaml"
    if not path.is_file():
        known = sorted(p.stem for p in VALUES.glob("*.yaml"))
        raise ValueError(f"no values for environment {env!r}; known: {', '.join(known)}")
    return yaml.safe_load(path.read_text())


def release_name(tag: str) -> str:
    """The image tag as a DNS-label suffix (the migration Job's name, the pods' label)."""
    slug = re.sub(r"[^a-z0-9-]+", "-", tag.lower()).strip("-")[:40].strip("-")
    if not slug:
        raise ValueError(f"image tag {tag!r} gives an empty release name")
    return slug


def mem_times(quantity: str, n: int) -> str:
    """A memory quantity like `24Gi` times `n` (`48Gi` for two GPUs)."""
    match = _QUANTITY.match(quantity)
    if not match:
        raise ValueError(f"memory {quantity!r} must be an integer with Ki, Mi, Gi or Ti")
    return f"{int(match.group(1)) * n}{match.group(2)}"


def _environment() -> jinja2.Environment:
    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(TEMPLATES),
        undefined=jinja2.StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        keep_trailing_newline=True,
        autoescape=False,
    )
    # JSON is YAML: every interpolated value goes out quoted and escaped exactly.
    env.filters["json"] = lambda v: json.dumps(v, ensure_ascii=False)
    env.filters["ipblock"] = lambda cidr: {"ipBlock": {"cidr": cidr}}
    env.filters["combine"] = lambda a, b: {**a, **b}
    # Terraform's outputs back in `terraform output -json`'s shape (what `--outputs` reads).
    env.filters["terraform_json"] = lambda tf: json.dumps(
        {k: {"value": v} for k, v in tf.items()}, ensure_ascii=False, sort_keys=True, indent=2
    )
    env.filters["pretty_json"] = lambda v: json.dumps(v, ensure_ascii=False, indent=2)
    env.globals["mem_times"] = mem_times
    return env


@dataclass(frozen=True)
class Release:
    """One environment at one image tag: what every template is rendered with. The engine
    image has its own tag (`engine_tag.py`: the content of what the engine runs; default the
    release's), so a release that leaves the engine alone rolls no GPU replica."""

    outputs: dict[str, Any]
    values: dict[str, Any]
    tag: str
    engine_tag: str = ""

    def context(self) -> dict[str, Any]:
        engine_tag = self.engine_tag or self.tag
        return {"tf": self.outputs, "values": self.values, "tag": self.tag,
                "release": release_name(self.tag), "engine_tag": engine_tag,
                "engine_release": release_name(engine_tag),
                "migration": {"action": "upgrade", "revision": "head"}}  # fmt: skip

    def scales_to_zero(self) -> bool:
        """Whether a deployment's floor may be 0 here (KEDA wakes it on the gateway's queue)."""
        return bool(self.values["engine"]["keda"].get("scale_to_zero", False))

    def render(self, template: str, **extra: Any) -> str:
        """One template's YAML text (one or more documents)."""
        text = _environment().get_template(f"{template}.yaml.j2").render(**(self.context() | extra))
        return text.lstrip("\n")

    def platform(self, templates: tuple[str, ...] = PRE_ROLLOUT + ROLLOUT) -> str:
        """The platform's manifests (all but the per-deployment engine resources)."""
        return "".join(self.render(t) for t in templates)

    def engine(self, spec: EngineSpec) -> str:
        """The engine resources of one platform deployment."""
        spec.check(self.outputs["gpu_pools"], scale_to_zero=self.scales_to_zero())
        engine = asdict(spec) | {"argv": list(spec.argv)}
        return self.render("engine", engine=engine)


def render_engine(release: Release, spec: EngineSpec) -> list[dict[str, Any]]:
    """The engine resources of one deployment as objects (what a launcher applies)."""
    return [d for d in yaml.safe_load_all(release.engine(spec)) if d]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="python -m loraplex.infra.k8s.render", description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--env", required=True, help="values/<env>.yaml")
    p.add_argument("--outputs", required=True, help="`terraform output -json` of that env")
    p.add_argument("--tag", required=True, help="image tag of the release")
    p.add_argument("--engine-tag", default="",
                   help="engine image tag (python -m loraplex.infra.k8s.engine_tag; default --tag)")  # fmt: skip
    sub = p.add_subparsers(dest="what", required=True)
    plat = sub.add_parser("platform", help="the platform's manifests")
    plat.add_argument("--phase", choices=["pre-rollout", "rollout", "all"], default="all")
    sub.add_parser("models-admin", help="an operator pod for `loraplex models add`")
    sub.add_parser("release-name", help="the release's name (the migration Job's suffix)")
    down = sub.add_parser("downgrade", help="a Job taking the database down to a revision")
    down.add_argument("--revision", required=True, help="the older release's head revision")
    eng = sub.add_parser("engine", help="the engine resources of one deployment")
    eng.add_argument("--deployment", required=True)
    eng.add_argument("--gpus", type=int, default=1, help="GPUs per replica (expert-parallel size)")
    eng.add_argument("--replicas", type=int, default=1)
    eng.add_argument("--max-replicas", type=int, default=None)
    eng.add_argument("--gpu-pool", required=True)
    eng.add_argument("argv", nargs=argparse.REMAINDER, help="-- then the engine options")
    return p


def main(argv: list[str] | None = None) -> int:
    """Print the requested manifests as YAML on stdout."""
    args = _parser().parse_args(argv)
    outputs = terraform_outputs(args.outputs)
    release = Release(outputs, load_values(args.env), args.tag, args.engine_tag)
    try:
        if args.what == "platform":
            phases = {"pre-rollout": PRE_ROLLOUT, "rollout": ROLLOUT, "all": PRE_ROLLOUT + ROLLOUT}
            sys.stdout.write(release.platform(phases[args.phase]))
        elif args.what == "models-admin":
            sys.stdout.write(release.platform(OPERATOR))
        elif args.what == "release-name":
            print(release_name(args.tag))
        elif args.what == "downgrade":
            migration = {"action": "downgrade", "revision": args.revision}
            sys.stdout.write(release.render("migrate", migration=migration))
        else:
            engine_argv = tuple(a for a in args.argv if a != "--")
            spec = EngineSpec(
                deployment=args.deployment,
                argv=engine_argv,
                gpus=args.gpus,
                replicas=args.replicas,
                max_replicas=args.max_replicas if args.max_replicas is not None else args.replicas,
                gpu_pool=args.gpu_pool,
            )
            sys.stdout.write(release.engine(spec))
    except (ValueError, NotImplementedError) as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
