"""Each workload's IAM policy grants the S3 actions its code calls, and lists the prefixes its
code lists. Derived from the code, not a copied list: the S3 calls of each role's modules are
read from their syntax tree (a call through `services.objects` counts as that helper's calls),
mapped to the IAM action AWS authorizes for each operation (the Service Authorization
Reference for Amazon S3, https://docs.aws.amazon.com/service-authorization/latest/reference/list_amazons3.html,
and each operation's "Permissions" section in the S3 API Reference: HeadObject needs
s3:GetObject, the multipart calls s3:PutObject, DeleteObjects s3:DeleteObject,
ListObjectsV2 s3:ListBucket, ListMultipartUploads s3:ListBucketMultipartUploads), and checked
against infra/terraform/modules/identity.

Listing is scoped by `StringLike` on s3:prefix, never `StringLikeIfExists` (which also allows
a list request without a prefix: the whole bucket's key names). That holds only because no
code waits for the 404 of a GET or HEAD on a missing key (S3 authorizes that 404 as a list of
the bucket without a prefix): optional files are looked for by listing their exact key
(`ObjectStore.find`), which `tests/platform/test_optional_fetches_list_first.py` checks
against the real server; here the calls of the loader's `ObjectStore` methods count as the
operations those methods make."""

from __future__ import annotations

import ast
import fnmatch
import re

from support.infra import REPO, TERRAFORM, fields, parsed, unq

from loraplex.platform.object_keys import TENANTS_ROOT

IDENTITY = TERRAFORM / "modules" / "identity"

# boto3 client operation -> the IAM action S3 authorizes it with.
OPS = {
    "get_object": "s3:GetObject",
    "head_object": "s3:GetObject",
    "put_object": "s3:PutObject",
    "upload_fileobj": "s3:PutObject",
    "create_multipart_upload": "s3:PutObject",
    "upload_part": "s3:PutObject",
    "complete_multipart_upload": "s3:PutObject",
    "abort_multipart_upload": "s3:AbortMultipartUpload",
    "list_parts": "s3:ListMultipartUploadParts",
    "delete_object": "s3:DeleteObject",
    "delete_objects": "s3:DeleteObject",
    "list_objects_v2": "s3:ListBucket",
    "list_objects": "s3:ListBucket",
    "list_multipart_uploads": "s3:ListBucketMultipartUploads",
}
BUCKET_ACTIONS = {"s3:ListBucket", "s3:ListBucketMultipartUploads"}

# The code each IRSA role runs (its service account's pods).
ROLE_CODE = {
    "api": [
        "platform/services/adapters.py",
        "platform/gateway/service.py",
        "platform/gateway/assets.py",
    ],  # fmt: skip
    "worker": [
        "platform/jobs/delete.py",
        "platform/jobs/reconcile.py",
        "platform/jobs/recovery.py",
        "platform/jobs/validate.py",
    ],  # fmt: skip
    "engine": [
        "loader/checkpoint_index.py",
        "platform/engine/model_source.py",
        "platform/engine/lora/sources.py",
    ],  # fmt: skip
    "models": ["platform/services/base_models.py"],
}
OBJECTS = REPO / "platform" / "services" / "objects.py"
STORE = REPO / "loader" / "object_store.py"


def _ops_of(tree: ast.AST) -> set[str]:
    """boto3 operations a syntax tree calls (directly, through a paginator or a presign)."""
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            name = node.func.attr
            if name in OPS:
                found.add(name)
            elif name in ("get_paginator", "generate_presigned_url") and node.args:
                arg = node.args[0]
                if isinstance(arg, ast.Constant) and arg.value in OPS:
                    found.add(arg.value)
    return found


def _closure(
    funcs: dict[str, ast.AST], via: type[ast.AST], extra: dict[str, set[str]] | None = None
) -> dict[str, set[str]]:
    """Each function's operations (its own, `extra`'s, and those of the functions it calls,
    by name or through `self.`)."""

    def callee(node: ast.AST) -> str | None:
        if not isinstance(node, ast.Call):
            return None
        f = node.func
        if via is ast.Name and isinstance(f, ast.Name):
            return f.id
        if via is ast.Attribute and isinstance(f, ast.Attribute):
            return f.attr
        return None

    direct = {name: _ops_of(f) | (extra or {}).get(name, set()) for name, f in funcs.items()}
    calls = {
        name: {c for n in ast.walk(f) if (c := callee(n)) in funcs} for name, f in funcs.items()
    }
    out = {}
    for name in funcs:
        seen, todo, ops = set(), [name], set()
        while todo:
            fn = todo.pop()
            if fn not in seen:
                seen.add(fn)
                ops |= direct[fn]
                todo += calls[fn]
        out[name] = ops
    return out


def _store_methods() -> dict[str, set[str]]:
    """Each `ObjectStore` method (loader/object_store.py) and the operations it makes."""
    tree = ast.parse(STORE.read_text())
    cls = next(c for c in tree.body if isinstance(c, ast.ClassDef) and c.name == "ObjectStore")
    funcs = {f.name: f for f in cls.body if isinstance(f, ast.FunctionDef)}
    return {name: ops for name, ops in _closure(funcs, ast.Attribute).items() if ops}


def _helpers() -> dict[str, set[str]]:
    """Each `services.objects` function and the operations it calls (helpers and the loader's
    `ObjectStore` methods included)."""
    tree = ast.parse(OBJECTS.read_text())
    funcs = {f.name: f for f in tree.body if isinstance(f, ast.FunctionDef)}
    store = _store_methods()
    via_store = {
        name: {op for n in ast.walk(f) if isinstance(n, ast.Call)
               and isinstance(n.func, ast.Attribute) for op in store.get(n.func.attr, ())}
        for name, f in funcs.items()
    }  # fmt: skip
    return _closure(funcs, ast.Name, via_store)


def needed_actions(role: str) -> set[str]:
    """The IAM actions the role's code needs."""
    helpers, store, ops = _helpers(), _store_methods(), set()
    for rel in ROLE_CODE[role]:
        tree = ast.parse((REPO / rel).read_text())
        ops |= _ops_of(tree)
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            attr, base = node.func.attr, node.func.value
            if isinstance(base, ast.Name) and base.id == "objects" and attr in helpers:
                ops |= helpers[attr]
            elif attr in store and not (isinstance(base, ast.Name) and base.id == "objects"):
                ops |= store[attr]  # an ObjectStore (or the node cache over one)
    return {OPS[o] for o in ops}


def _locals() -> dict:
    out: dict = {}
    for block in parsed(IDENTITY / "main.tf").get("locals", []):
        out.update(fields(block))
    return out


def _strings(value: object) -> list[str]:
    return [unq(v) for v in value] if isinstance(value, list) else [unq(value)]


def _list_condition() -> dict:
    """The condition of the `ListOwnKeySpaces` statement of the S3 policy document."""
    doc = next(d for d in parsed(IDENTITY / "main.tf")["data"] if '"aws_iam_policy_document"' in d)
    statements = doc['"aws_iam_policy_document"']['"s3"']["statement"]
    stmt = next(st for st in statements if unq(st["sid"]) == "ListOwnKeySpaces")
    (condition,) = stmt["condition"]
    return {k: unq(v) if isinstance(v, str) else v for k, v in condition.items()}


def granted(role: str) -> tuple[set[str], list[str]]:
    """The role's S3 actions and the prefixes its ListBucket condition allows, as the
    identity module's locals build its policy."""
    loc = _locals()
    access = {op: _strings(v) for op, v in fields(fields(loc["access"])[role]).items()}
    actions = set(_strings(loc["read_actions"])) if access["read"] else set()
    if access["write"]:
        actions |= set(_strings(loc["write_actions"])) | set(_strings(loc["write_bucket_actions"]))
    actions.add("s3:ListBucket")
    globs = {k: unq(v) for k, v in fields(loc["key_space_globs"]).items()}
    roots = {k: unq(v) for k, v in fields(loc["key_space_roots"]).items()}
    prefixes = [globs[s] for s in access["read"] + access["write"]]
    prefixes += [roots[s] for s in access.get("list_roots", [])]
    return actions, prefixes


def test_every_role_is_granted_what_its_code_calls() -> None:
    for role in ROLE_CODE:
        need = needed_actions(role)
        have, _ = granted(role)
        assert need <= have, (role, sorted(need - have))
    # The derivation reached the calls the issue is about.
    assert "s3:ListBucketMultipartUploads" in needed_actions("worker")
    assert "s3:ListBucketMultipartUploads" in needed_actions("api")
    # Engines read, and list the exact keys of optional files (checkpoint index, model files).
    assert needed_actions("engine") == {"s3:GetObject", "s3:ListBucket"}
    # The gateway (api role) looks for the optional tokenizer files by listing them.
    assert "s3:ListBucket" in needed_actions("api")


def test_listing_needs_a_prefix_inside_the_role_key_spaces() -> None:
    """`StringLike`, not `StringLikeIfExists`: IfExists also allows a list request with no
    s3:prefix at all, which names every key of the bucket (every tenant's adapters)."""
    condition = _list_condition()
    assert condition["variable"] == "s3:prefix"
    assert condition["test"] == "StringLike", condition["test"]
    for role in ROLE_CODE:
        _, prefixes = granted(role)
        # No glob admits the empty prefix or a bucket-wide one.
        assert not any(fnmatch.fnmatchcase(p0, g) for g in prefixes for p0 in ("", "a", "*"))
        # What the role's code lists: the exact key of an optional file, or a version prefix
        # to delete, is inside its key spaces.
        loc = _locals()
        access = {op: _strings(v) for op, v in fields(fields(loc["access"])[role]).items()}
        globs = {k: unq(v) for k, v in fields(loc["key_space_globs"]).items()}
        for space in access["read"] + access["write"]:
            assert globs[space] in prefixes, (role, space)


def test_the_engine_lists_each_optional_model_file_in_its_key_space() -> None:
    """The keys the engine lists (a model folder's index and small files) match its globs."""
    from loraplex.loader.checkpoint_index import INDEX_NAME, SINGLE_NAME
    from loraplex.platform import object_keys

    _, prefixes = granted("engine")
    folder = object_keys.model_prefix("llama-8b")
    for name in (INDEX_NAME, SINGLE_NAME, "generation_config.json", "tokenizer.json"):
        assert any(fnmatch.fnmatchcase(folder + name, g) for g in prefixes), name


def test_the_orphan_reconciler_may_list_the_tenants_root() -> None:
    """It lists every adapter key under `tenants/` to find objects without a row."""
    tree = ast.parse((REPO / "platform/jobs/reconcile.py").read_text())
    listed = {kw.value.id for n in ast.walk(tree) if isinstance(n, ast.Call)
              for kw in n.keywords if kw.arg == "Prefix" and isinstance(kw.value, ast.Name)}  # fmt: skip
    assert listed == {"TENANTS_ROOT"}
    _, prefixes = granted("worker")
    # s3:prefix is matched with StringLike: `*` is any run of characters (fnmatch's `*`).
    assert any(fnmatch.fnmatchcase(TENANTS_ROOT, p) for p in prefixes), prefixes
    # The models role cannot list tenants.
    _, models = granted("models")
    assert not any(fnmatch.fnmatchcase(TENANTS_ROOT, p) for p in models)


def test_listing_uploads_is_granted_on_the_bucket_to_writers() -> None:
    text = (IDENTITY / "main.tf").read_text()
    block = re.search(r'sid\s*=\s*"ListOwnUploads"\s*actions\s*=\s*(\S+)\s*resources\s*=\s*(\[[^\]]*\])',
                      text)  # fmt: skip
    assert block, "no ListOwnUploads statement"
    assert block.group(1) == "local.write_bucket_actions"
    assert block.group(2) == "[var.bucket_arn]"
