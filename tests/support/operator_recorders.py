"""Recorders for the operator dry run (tests/infra/test_operator_dry_run.py): stand-ins for
`terraform`, `aws`, `kubectl`, `docker`, `curl` and the operator's editor that a README step
calls. Each records its call and checks what the step names against the repository: a
Terraform folder, variable or output that does not exist, a Dockerfile (or a file it copies)
missing from the build context, a Kubernetes object never applied, a `loraplex` command the
CLI does not have, a model never registered: the recorder exits non-zero with the reason.

    python operator_recorders.py TOOL ARGS...     (bin/TOOL wrappers call this)

State between calls lives in `$DRY_RUN_DIR/state.json`; every call is appended to
`$DRY_RUN_DIR/calls.jsonl`. `$DRY_RUN_OUTPUTS` is the `terraform output -json` to answer with.
"""

from __future__ import annotations

import json
import os
import re
import sys
from pathlib import Path
from typing import Any

DIR = Path(os.environ.get("DRY_RUN_DIR", "."))
STATE = DIR / "state.json"
LB_HOST = "k8s-loraplex-0123456789.us-east-1.elb.amazonaws.com"
API_KEY = "lp_dryrun_0123456789abcdef"
ECR_TOKEN = "ecr-token-dry-run"


class Refused(Exception):
    """A step names something that does not exist."""


def _state() -> dict[str, Any]:
    if STATE.is_file():
        return json.loads(STATE.read_text())
    return {"applied": [], "built": [], "tenants": [], "models": {}, "deployments": {},
            "copied": [], "keys": []}  # fmt: skip


def _save(state: dict[str, Any]) -> None:
    STATE.write_text(json.dumps(state))


def _outputs() -> dict[str, Any]:
    raw = json.loads(Path(os.environ["DRY_RUN_OUTPUTS"]).read_text())
    return {k: v["value"] for k, v in raw.items()}


def _hcl_keys(path: Path) -> set[str]:
    """The top-level names of an HCL file (python-hcl2's own `__...__` entries left out)."""
    import hcl2

    with path.open() as f:
        return {k for k in hcl2.load(f) if not k.startswith("__")}


def _hcl_blocks(folder: Path, kind: str) -> dict[str, dict[str, Any]]:
    import hcl2

    out: dict[str, dict[str, Any]] = {}
    for path in sorted(folder.glob("*.tf")):
        with path.open() as f:
            for block in hcl2.load(f).get(kind, []):
                out.update({k.strip('"'): v for k, v in block.items() if not k.startswith("__")})
    return out


def _option(args: list[str], name: str) -> str | None:
    """The value of `--name VALUE` or `--name=VALUE`."""
    for i, a in enumerate(args):
        if a == name and i + 1 < len(args):
            return args[i + 1]
        if a.startswith(name + "="):
            return a.split("=", 1)[1]
    return None


# --- terraform ---------------------------------------------------------------------------


def terraform(args: list[str]) -> str:
    chdir = next((a.split("=", 1)[1] for a in args if a.startswith("-chdir=")), ".")
    folder = Path(chdir)
    if not folder.is_dir() or not list(folder.glob("*.tf")):
        raise Refused(f"terraform -chdir={chdir}: no Terraform configuration there")
    rest = [a for a in args if not a.startswith("-chdir=")]
    sub = rest[0]
    variables = _hcl_blocks(folder, "variable")
    if sub == "init":
        for a in rest:
            if a.startswith("-backend-config="):
                key = a.split("=", 2)[1]
                if key not in ("bucket", "region", "key"):
                    raise Refused(f"terraform init: unknown backend setting {key}")
        return "Terraform has been successfully initialized!\n"
    if sub == "apply":
        given = {rest[i + 1].split("=", 1)[0] for i, a in enumerate(rest) if a == "-var"}
        tfvars = folder / "terraform.tfvars"
        if tfvars.is_file():
            given |= _hcl_keys(tfvars)
        unknown = given - set(variables)
        if unknown:
            raise Refused(f"terraform apply in {chdir}: undeclared variables {sorted(unknown)}")
        required = {n for n, v in variables.items() if "default" not in v}
        if required - given:
            raise Refused(f"terraform apply in {chdir}: no value for {sorted(required - given)}")
        return "Apply complete! Resources: 0 added, 0 changed, 0 destroyed.\n"
    if sub == "output":
        declared = set(_hcl_blocks(folder, "output"))
        names = [a for a in rest[1:] if not a.startswith("-")]
        outputs = _outputs()
        if not names:
            if set(outputs) != declared:
                raise Refused(f"outputs of {chdir} differ from example-outputs.json: "
                              f"{sorted(set(outputs) ^ declared)}")  # fmt: skip
            return json.dumps({k: {"value": v, "sensitive": False} for k, v in outputs.items()})
        [name] = names
        if name not in declared:
            raise Refused(f"terraform output {name}: {chdir} has no such output")
        value = outputs[name]
        return (json.dumps(value) if "-json" in rest else str(value)) + "\n"
    raise Refused(f"terraform {sub}: not a step this dry run knows")


# --- aws ---------------------------------------------------------------------------------


def aws(args: list[str]) -> str:
    outputs = _outputs()
    service, op = args[0], args[1]
    if (service, op) == ("ecr", "get-login-password"):
        return ECR_TOKEN + "\n"
    if (service, op) == ("ecr", "describe-images"):
        repo = _option(args, "--repository-name")
        repos = {url.split("/", 1)[1] for url in outputs["image_repositories"].values()}
        if repo not in repos:
            raise Refused(f"aws ecr describe-images: no repository {repo!r} (have {repos})")
        raise SystemExit(254)  # ImageNotFoundException: the engine image is built
    if (service, op) == ("eks", "update-kubeconfig"):
        if _option(args, "--name") != outputs["cluster_name"]:
            raise Refused(f"aws eks update-kubeconfig: no cluster {_option(args, '--name')!r}")
        return f"Updated context arn:aws:eks:...:cluster/{outputs['cluster_name']}\n"
    if (service, op) == ("secretsmanager", "get-secret-value"):
        arn = _option(args, "--secret-id")
        if arn not in [v for v in outputs.values() if isinstance(v, str)]:
            raise Refused(f"aws secretsmanager: {arn!r} is no secret of the outputs")
        return json.dumps({"value": "lpx-admin-dry-run"}) + "\n"
    raise Refused(f"aws {service} {op}: not a step this dry run knows")


# --- docker ------------------------------------------------------------------------------


def docker(args: list[str], stdin: str) -> str:
    state = _state()
    sub = args[0]
    if sub == "login":
        registry = args[-1]
        hosts = {url.split("/", 1)[0] for url in _outputs()["image_repositories"].values()}
        if registry not in hosts or stdin.strip() != ECR_TOKEN:
            raise Refused(f"docker login {registry}: not the ECR registry, or no ECR token")
        return "Login Succeeded\n"
    if sub == "build":
        if _option(args, "--platform") != "linux/amd64":
            raise Refused("docker build: --platform linux/amd64 is missing (the nodes' arch)")
        dockerfile, tag, context = Path(_option(args, "-f") or ""), _option(args, "-t"), args[-1]
        if not dockerfile.is_file():
            raise Refused(f"docker build: no Dockerfile {dockerfile} from {os.getcwd()}")
        for line in dockerfile.read_text().splitlines():
            m = re.match(r"^COPY (?!--from)(.+) (\S+)$", line)
            if m:
                for src in m.group(1).split():
                    if not (Path(context) / src).exists():
                        raise Refused(f"docker build: {dockerfile} copies {src}, not in the "
                                      f"context {Path(context).resolve()}")  # fmt: skip
        state["built"].append(tag)
        _save(state)
        return f"naming to {tag} done\n"
    if sub == "push":
        if args[1] not in state["built"]:
            raise Refused(f"docker push {args[1]}: no such image was built")
        return f"{args[1]}: digest: sha256:0 size: 0\n"
    raise Refused(f"docker {sub}: not a step this dry run knows")


# --- kubectl -----------------------------------------------------------------------------


def _loraplex(argv: list[str], state: dict[str, Any]) -> str:
    """A `loraplex` command run in a pod: parsed by the real CLI, with its effects recorded."""
    from loraplex.platform.cli import build_parser

    try:
        ns = build_parser().parse_args(argv)
    except SystemExit as exc:
        raise Refused(f"loraplex {' '.join(argv)}: the CLI refuses it") from exc
    command = (ns.command, getattr(ns, f"{ns.command}_command", None))
    if command == ("models", "add"):
        if str(ns.path) not in state["copied"]:
            raise Refused(f"loraplex models add: {ns.path} was never copied into the pod")
        state["models"][ns.name] = str(ns.path)
        return f"registered base model {ns.name}\n"
    if command == ("deployments", "create"):
        if ns.base_model not in state["models"]:
            raise Refused(f"deployments create: base model {ns.base_model!r} is not registered")
        state["deployments"][ns.name] = ns.base_model
        return f"created deployment {ns.name}\n"
    if command == ("tenants", "create"):
        state["tenants"].append(ns.name)
        return f"created tenant {ns.name}\n"
    if command == ("keys", "create"):
        if ns.tenant not in state["tenants"]:
            raise Refused(f"keys create: no tenant {ns.tenant!r}")
        state["keys"].append(API_KEY)
        return API_KEY + "\n"
    raise Refused(f"loraplex {' '.join(argv)}: not a step this dry run knows")


def _known(state: dict[str, Any], ref: str) -> bool:
    kind, _, name = ref.partition("/")
    kind = {"deploy": "Deployment", "deployment": "Deployment", "job": "Job", "pod": "Pod",
            "ingress": "Ingress"}.get(kind.lower(), kind)  # fmt: skip
    if kind == "Deployment" and name.removeprefix("engine-") in state["deployments"]:
        return True  # the launcher makes engine-NAME for each deployment row
    return [kind, name] in state["applied"]


def kubectl(args: list[str], stdin: str) -> str:
    state = _state()
    outputs = _outputs()
    args = list(args)
    if "-n" in args:
        i = args.index("-n")
        if args[i + 1] != outputs["namespace"]:
            raise Refused(f"kubectl -n {args[i + 1]}: the namespace is {outputs['namespace']}")
        del args[i : i + 2]
    sub, out = args[0], ""
    if sub == "apply":
        if args[1:] != ["-f", "-"]:
            raise Refused(f"kubectl {' '.join(args)}: only `apply -f -` is expected")
        import yaml

        docs = [d for d in yaml.safe_load_all(stdin) if d]
        if not docs:
            raise Refused("kubectl apply: nothing on stdin")
        for d in docs:
            state["applied"].append([d["kind"], d["metadata"]["name"]])
            out += f"{d['kind'].lower()}/{d['metadata']['name']} serverside-applied\n"
    elif sub == "wait":
        target = next(a for a in args[1:] if not a.startswith("-"))
        if not _known(state, target):
            raise Refused(f"kubectl wait {target}: no such object was applied")
        out = f"{target} condition met\n"
    elif sub == "rollout":
        target = args[2]
        if not _known(state, target):
            raise Refused(f"kubectl rollout status {target}: no such object was applied")
        out = f'deployment "{target}" successfully rolled out\n'
    elif sub == "cp":
        src, dst = args[1], args[2]
        pod, _, path = dst.partition(":")
        if not Path(src).exists():
            raise Refused(f"kubectl cp: {src} does not exist here")
        if not _known(state, f"pod/{pod}"):
            raise Refused(f"kubectl cp: no pod {pod}")
        state["copied"].append(path)
    elif sub == "exec":
        split = args.index("--")
        target = args[1]
        ref = target if "/" in target else f"pod/{target}"
        if not _known(state, ref):
            raise Refused(f"kubectl exec {target}: no such object was applied")
        command = args[split + 1 :]
        if command[0] != "loraplex":
            raise Refused(f"kubectl exec: {command[0]} is not a step this dry run knows")
        out = _loraplex(command[1:], state)
    elif sub == "get" and args[1] == "ingress":
        if not _known(state, f"ingress/{args[2]}"):
            raise Refused(f"kubectl get ingress {args[2]}: no such object was applied")
        out = LB_HOST
    elif sub == "delete" and args[1] == "pod":
        if not _known(state, f"pod/{args[2]}"):
            raise Refused(f"kubectl delete pod {args[2]}: no such pod")
        out = f'pod "{args[2]}" deleted\n'
    else:
        raise Refused(f"kubectl {' '.join(args)}: not a step this dry run knows")
    _save(state)
    return out


# --- curl and the editor -----------------------------------------------------------------


def curl(args: list[str]) -> str:
    state = _state()
    url = next(a for a in args if a.startswith("http"))
    if not url.startswith("https://") or not url.endswith("/v1/chat/completions"):
        raise Refused(f"curl {url}: not the API's HTTPS chat completions URL")
    headers = [args[i + 1] for i, a in enumerate(args) if a == "-H"]
    if not any(h == f"Authorization: Bearer {k}" for h in headers for k in state["keys"]):
        raise Refused("curl: no Authorization header with a key `keys create` printed")
    body = json.loads(_option(args, "-d") or "{}")
    models = set(state["deployments"].values()) | set(state["deployments"])
    if body.get("model") not in models or body.get("stream") is not True:
        raise Refused(f"curl: model {body.get('model')!r} is not served, or stream is off")
    chunk = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "model": body["model"],
             "choices": [{"index": 0, "delta": {"content": "Hello"}, "finish_reason": None}]}  # fmt: skip
    return f"data: {json.dumps(chunk)}\n\ndata: [DONE]\n\n"


def editor(args: list[str]) -> str:
    """The operator's edit of terraform.tfvars: every variable gets a real-looking value."""
    path = Path(args[-1])
    if not path.is_file():
        raise Refused(f"editor: {path} does not exist")
    values = json.loads(os.environ["DRY_RUN_TFVARS"])
    present = _hcl_keys(path)
    lines = [f"{k} = {json.dumps(values[k])}" for k in sorted(present) if k in values]
    missing = present - set(values)
    if missing:
        raise Refused(f"editor: the example holds variables this dry run cannot fill: {missing}")
    path.write_text("\n".join(lines) + "\n")
    return ""


def main() -> int:
    """Dispatch on the tool's name; record the call; print the answer or refuse."""
    tool, args = sys.argv[1], sys.argv[2:]
    stdin = "" if sys.stdin.isatty() else sys.stdin.read() if tool in ("kubectl", "docker") else ""
    with (DIR / "calls.jsonl").open("a") as log:
        log.write(json.dumps({"tool": tool, "args": args, "cwd": os.getcwd()}) + "\n")
    handlers = {"terraform": lambda: terraform(args), "aws": lambda: aws(args),
                "docker": lambda: docker(args, stdin), "kubectl": lambda: kubectl(args, stdin),
                "curl": lambda: curl(args), "editor": lambda: editor(args)}  # fmt: skip
    try:
        sys.stdout.write(handlers[tool]())
    except Refused as exc:
        print(f"DRY RUN REFUSED: {exc}", file=sys.stderr)
        return 3
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
