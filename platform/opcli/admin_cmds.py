"""`loraplex tenants|keys|deployments`: the admin API (LORAPLEX_ADMIN_KEY) from the shell."""

from __future__ import annotations

import argparse
import uuid
from typing import Any

from .client import ApiClient, CliError, connect, guarded
from .output import Column, emit, field, print_object, print_table

LIMIT_OPTIONS = {
    "rpm": "requests_per_minute",
    "tpm": "tokens_per_minute",
    "monthly_quota": "monthly_token_quota",
    "max_uploads": "max_concurrent_uploads",
    "max_stored_bytes": "max_stored_adapter_bytes",
}

TENANT_COLUMNS: list[Column] = [
    field("id"),
    field("name"),
    ("rpm", lambda t: t["limits"]["requests_per_minute"]),
    ("tpm", lambda t: t["limits"]["tokens_per_minute"]),
    ("monthly_quota", lambda t: t["limits"]["monthly_token_quota"]),
    field("created_at"),
]
KEY_FIELDS: list[Column] = [
    field("id"),
    field("tenant_id"),
    field("name"),
    field("prefix"),
    field("scopes"),
    field("created_at"),
    field("revoked_at"),
]
DEPLOYMENT_COLUMNS: list[Column] = [
    field("id"),
    field("name"),
    field("base_model"),
    ("weights", lambda d: d["quantization"]["weights"]),
    ("kv_cache", lambda d: d["quantization"]["kv_cache"]),
    field("max_loras"),
    field("max_lora_rank"),
    field("replicas"),
]


def _limit_value(text: str) -> int | None:
    """An integer limit, or `default` (null: back to the platform default)."""
    if text.lower() == "default":
        return None
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"expected an integer or 'default', got {text!r}"
        ) from None


def _limits(args: argparse.Namespace) -> dict[str, int | None]:
    """The limit options the operator gave (by API field name)."""
    return {api: getattr(args, opt) for opt, api in LIMIT_OPTIONS.items() if hasattr(args, opt)}


def _is_uuid(text: str) -> bool:
    try:
        uuid.UUID(text)
    except ValueError:
        return False
    return True


def find_by_name(api: ApiClient, path: str, ref: str, what: str) -> dict[str, Any]:
    """The object listed at `path` whose id or name is `ref` (CliError if none)."""
    items = api.json("GET", path)["data"]
    for item in items:
        if item["id"] == ref or item["name"] == ref:
            return item
    raise CliError(f"no {what} named or with id {ref!r}", code=f"{what}_not_found")


def tenant_id(api: ApiClient, ref: str) -> str:
    """A tenant id from an id or a name."""
    return ref if _is_uuid(ref) else find_by_name(api, "/admin/v1/tenants", ref, "tenant")["id"]


def show_tenant(tenant: dict[str, Any]) -> None:
    """A tenant and its limits."""
    print_object(tenant, [field("id"), field("name"), field("created_at")])
    for name, value in tenant["limits"].items():
        print(f"  {name}: {'default' if value is None else value}")


def cmd_tenants_create(args: argparse.Namespace) -> int:
    """Create a tenant (optionally with limits)."""
    with connect(args.url, "admin") as api:
        body = {"name": args.name, **{k: v for k, v in _limits(args).items() if v is not None}}
        emit(api.json("POST", "/admin/v1/tenants", json=body), args.json, show_tenant)
    return 0


def cmd_tenants_list(args: argparse.Namespace) -> int:
    """Every tenant."""
    with connect(args.url, "admin") as api:
        data = api.json("GET", "/admin/v1/tenants")["data"]
        emit(data, args.json, lambda rows: print_table(rows, TENANT_COLUMNS))
    return 0


def cmd_tenants_limits(args: argparse.Namespace) -> int:
    """Show a tenant's limits, or change the ones given."""
    with connect(args.url, "admin") as api:
        tid = tenant_id(api, args.tenant)
        changes = _limits(args)
        if changes:
            tenant = api.json("PATCH", f"/admin/v1/tenants/{tid}", json=changes)
        else:
            tenant = api.json("GET", f"/admin/v1/tenants/{tid}")
        emit(tenant, args.json, show_tenant)
    return 0


def cmd_keys_create(args: argparse.Namespace) -> int:
    """Issue an API key for a tenant; the secret is printed once."""
    with connect(args.url, "admin") as api:
        tid = tenant_id(api, args.tenant)
        body: dict[str, Any] = {"name": args.name}
        if args.scope:
            body["scopes"] = args.scope
        key = api.json("POST", f"/admin/v1/tenants/{tid}/api-keys", json=body)
    if args.json:
        emit(key, True, print)
    elif args.quiet:
        print(key["key"])
    else:
        print_object(key, KEY_FIELDS)
        print(f"key  {key['key']}")
        print("(the key is shown only now: store it, e.g. export LORAPLEX_API_KEY=...)")
    return 0


def cmd_keys_list(args: argparse.Namespace) -> int:
    """A tenant's keys (no secrets)."""
    with connect(args.url, "admin") as api:
        tid = tenant_id(api, args.tenant)
        data = api.json("GET", f"/admin/v1/tenants/{tid}/api-keys")["data"]
        emit(data, args.json, lambda rows: print_table(rows, KEY_FIELDS))
    return 0


def cmd_keys_revoke(args: argparse.Namespace) -> int:
    """Revoke a key by id: requests with it are refused from now on."""
    with connect(args.url, "admin") as api:
        key = api.json("DELETE", f"/admin/v1/api-keys/{args.key_id}")
        emit(key, args.json, lambda k: print(f"revoked key {k['id']} ({k['prefix']}...)"))
    return 0


def cmd_deployments_create(args: argparse.Namespace) -> int:
    """Create a deployment of a registered base model."""
    body: dict[str, Any] = {
        "name": args.name,
        "base_model": args.base_model,
        "quantization": {"weights": args.weights, "kv_cache": args.kv_cache},
        "replicas": args.replicas,
    }
    if args.max_loras is not None:
        body["max_loras"] = args.max_loras
    if args.max_lora_rank is not None:
        body["max_lora_rank"] = args.max_lora_rank
    if args.cold_start_wait is not None:
        body["cold_start_wait_s"] = args.cold_start_wait
    if args.tool_call_format is not None:
        body["tool_call_format"] = args.tool_call_format
    with connect(args.url, "admin") as api:
        dep = api.json("POST", "/admin/v1/deployments", json=body)
        emit(dep, args.json, lambda d: print_object(d, DEPLOYMENT_COLUMNS))
    return 0


def cmd_deployments_list(args: argparse.Namespace) -> int:
    """Every deployment."""
    with connect(args.url, "admin") as api:
        data = api.json("GET", "/admin/v1/deployments")["data"]
        emit(data, args.json, lambda rows: print_table(rows, DEPLOYMENT_COLUMNS))
    return 0


def cmd_deployments_scale(args: argparse.Namespace) -> int:
    """Set a deployment's replica count (by id or name)."""
    with connect(args.url, "admin") as api:
        ref = args.deployment
        if not _is_uuid(ref):
            ref = find_by_name(api, "/admin/v1/deployments", ref, "deployment")["id"]
        dep = api.json("PATCH", f"/admin/v1/deployments/{ref}", json={"replicas": args.replicas})
        emit(dep, args.json, lambda d: print(f"{d['name']}: {d['replicas']} replicas"))
    return 0


def cmd_deployments_route(args: argparse.Namespace) -> int:
    """Set how the gateway routes to a deployment: its weight among the deployments of its
    base model (or by capacity), and whether requests may name it."""
    body: dict[str, Any] = {}
    if args.by_capacity:
        body["routing_weight"] = None
    elif args.weight is not None:
        body["routing_weight"] = args.weight
    if args.nameable is not None:
        body["nameable"] = args.nameable
    if not body:
        raise SystemExit("give --weight, --by-capacity or --nameable/--not-nameable")
    with connect(args.url, "admin") as api:
        ref = args.deployment
        if not _is_uuid(ref):
            ref = find_by_name(api, "/admin/v1/deployments", ref, "deployment")["id"]
        dep = api.json("PATCH", f"/admin/v1/deployments/{ref}", json=body)
        weight = "by capacity" if dep["routing_weight"] is None else dep["routing_weight"]

        def show(d: dict[str, Any]) -> None:
            print(f"{d['name']}: weight {weight}, nameable {str(d['nameable']).lower()}")

        emit(dep, args.json, show)
    return 0


def cmd_deployments_tools(args: argparse.Namespace) -> int:
    """Set how the gateway reads tool calls in a deployment's free output (`auto`): a format,
    or the one its chat template teaches."""
    with connect(args.url, "admin") as api:
        ref = args.deployment
        if not _is_uuid(ref):
            ref = find_by_name(api, "/admin/v1/deployments", ref, "deployment")["id"]
        body = {"tool_call_format": None if args.from_template else args.format}
        dep = api.json("PATCH", f"/admin/v1/deployments/{ref}", json=body)

        def show(d: dict[str, Any]) -> None:
            how = d["tool_call_format"] or "the chat template teaches"
            print(f"{d['name']}: tool calls read as {how}")

        emit(dep, args.json, show)
    return 0


def cmd_deployments_status(args: argparse.Namespace) -> int:
    """A deployment's replicas as the gateway sees them: ready, still starting, and wanted."""
    with connect(args.url, "admin") as api:
        ref = args.deployment
        if not _is_uuid(ref):
            ref = find_by_name(api, "/admin/v1/deployments", ref, "deployment")["id"]
        st = api.json("GET", f"/admin/v1/deployments/{ref}/replicas")
        emit(st, args.json, lambda s: print(f"{s['deployment']}: {s['ready']} ready, "
                                            f"{s['starting']} starting, {s['desired']} desired"))  # fmt: skip
    return 0


def _limit_args(parser: argparse.ArgumentParser) -> None:
    helps = {
        "rpm": "requests per minute",
        "tpm": "tokens per minute",
        "monthly_quota": "monthly token quota",
        "max_uploads": "concurrent uploads",
        "max_stored_bytes": "stored adapter bytes",
    }
    for opt, what in helps.items():
        parser.add_argument(
            "--" + opt.replace("_", "-"),
            dest=opt,
            type=_limit_value,
            default=argparse.SUPPRESS,
            metavar="N",
            help=f"{what} ('default' resets it)",
        )


def add_parsers(sub: Any, common: argparse.ArgumentParser) -> None:
    """Register `tenants`, `keys` and `deployments` on the top-level subparsers."""
    tenants = sub.add_parser("tenants", help="manage tenants (admin key)")
    ts = tenants.add_subparsers(dest="tenants_command", required=True, metavar="ACTION")
    p = ts.add_parser("create", parents=[common], help="create a tenant")
    p.add_argument("name")
    _limit_args(p)
    p.set_defaults(func=guarded(cmd_tenants_create))
    p = ts.add_parser("list", parents=[common], help="list tenants")
    p.set_defaults(func=guarded(cmd_tenants_list))
    p = ts.add_parser("limits", parents=[common], help="show or change a tenant's limits")
    p.add_argument("tenant", help="tenant id or name")
    _limit_args(p)
    p.set_defaults(func=guarded(cmd_tenants_limits))

    keys = sub.add_parser("keys", help="manage tenants' API keys (admin key)")
    ks = keys.add_subparsers(dest="keys_command", required=True, metavar="ACTION")
    p = ks.add_parser("create", parents=[common], help="issue a key (the secret is shown once)")
    p.add_argument("tenant", help="tenant id or name")
    p.add_argument("--name", default="cli", help="a label for the key")
    p.add_argument("--scope", action="append", help="limit the key to a scope (repeatable)")
    p.add_argument("-q", "--quiet", action="store_true", help="print only the secret")
    p.set_defaults(func=guarded(cmd_keys_create))
    p = ks.add_parser("list", parents=[common], help="list a tenant's keys")
    p.add_argument("tenant", help="tenant id or name")
    p.set_defaults(func=guarded(cmd_keys_list))
    p = ks.add_parser("revoke", parents=[common], help="revoke a key")
    p.add_argument("key_id")
    p.set_defaults(func=guarded(cmd_keys_revoke))

    deps = sub.add_parser("deployments", help="manage deployments (admin key)")
    ds = deps.add_subparsers(dest="deployments_command", required=True, metavar="ACTION")
    p = ds.add_parser("create", parents=[common], help="create a deployment")
    p.add_argument("name")
    p.add_argument("--base-model", required=True)
    p.add_argument("--weights", default="bf16", help="weight quantization (default bf16)")
    p.add_argument("--kv-cache", default="auto", help="KV-cache dtype (default auto)")
    p.add_argument("--max-loras", type=int)
    p.add_argument("--max-lora-rank", type=int)
    p.add_argument("--replicas", type=int, default=1)
    p.add_argument("--cold-start-wait", type=float, metavar="SECONDS",
                   help="how long a request waits for a starting replica (default 120)")  # fmt: skip
    p.add_argument("--tool-call-format", metavar="FORMAT",
                   help="how tool calls are read (hermes, llama3_json, qwen3_xml; default: "
                        "the chat template's)")  # fmt: skip
    p.set_defaults(func=guarded(cmd_deployments_create))
    p = ds.add_parser("list", parents=[common], help="list deployments")
    p.set_defaults(func=guarded(cmd_deployments_list))
    p = ds.add_parser("scale", parents=[common], help="set a deployment's replica count")
    p.add_argument("deployment", help="deployment id or name")
    p.add_argument("--replicas", type=int, required=True)
    p.set_defaults(func=guarded(cmd_deployments_scale))
    p = ds.add_parser("route", parents=[common], help="routing weight and naming")
    p.add_argument("deployment", help="deployment id or name")
    how = p.add_mutually_exclusive_group()
    how.add_argument("--weight", type=float, help="share of its base model's traffic (0: standby)")
    how.add_argument("--by-capacity", action="store_true", help="clear the weight")
    name = p.add_mutually_exclusive_group()
    name.add_argument("--nameable", dest="nameable", action="store_true", default=None,
                      help="requests may pick it (X-Loraplex-Deployment header)")  # fmt: skip
    name.add_argument("--not-nameable", dest="nameable", action="store_false")
    p.set_defaults(func=guarded(cmd_deployments_route))
    p = ds.add_parser("tools", parents=[common], help="how tool calls are read")
    p.add_argument("deployment", help="deployment id or name")
    fmt = p.add_mutually_exclusive_group(required=True)
    fmt.add_argument("--format", help="hermes, llama3_json or qwen3_xml")
    fmt.add_argument("--from-template", action="store_true", help="the chat template's format")
    p.set_defaults(func=guarded(cmd_deployments_tools))
    p = ds.add_parser("status", parents=[common], help="ready and starting replicas")
    p.add_argument("deployment", help="deployment id or name")
    p.set_defaults(func=guarded(cmd_deployments_status))
