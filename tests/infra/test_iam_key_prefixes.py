"""The IRSA policies grant exactly the bucket key spaces the code writes and reads.

The expected globs come from the code's own layout (`loraplex.platform.object_keys`); the
policies are parsed from infra/terraform/modules/identity."""

from __future__ import annotations

import fnmatch
import re
import uuid

from support.infra import TERRAFORM, blocks, fields, folder_text, parsed, unq

from loraplex.platform import object_keys
from loraplex.platform.object_keys import KEY_SPACES

IDENTITY = TERRAFORM / "modules" / "identity"


def _locals() -> dict:
    out: dict = {}
    for block in parsed(IDENTITY / "main.tf").get("locals", []):
        out.update(fields(block))
    return out


def test_identity_globs_are_the_code_key_spaces() -> None:
    globs = {k: unq(v) for k, v in fields(_locals()["key_space_globs"]).items()}
    assert globs == {ks.name: ks.iam_glob() for ks in KEY_SPACES}


def test_each_workload_gets_only_what_it_does() -> None:
    access = {
        role: {op: {unq(s) for s in spaces} for op, spaces in fields(body).items()
               if op != "list_roots"}
        for role, body in fields(_locals()["access"]).items()
    }  # fmt: skip
    names = {ks.name for ks in KEY_SPACES}
    for role, ops in access.items():
        assert ops["read"] | ops["write"] <= names, role
    # Engines only read: model weights and adapters.
    assert access["engine"] == {"read": names, "write": set()}
    # Uploads (presigned multipart included) land in adapter folders, written by the API.
    assert object_keys.ADAPTERS.name in access["api"]["write"]
    assert object_keys.MODELS.name not in access["api"]["write"]
    assert object_keys.MODELS.name not in access["worker"]["read"] | access["worker"]["write"]
    assert access["models"] == {"read": {"models"}, "write": {"models"}}


def test_policies_name_no_object_resource_but_the_key_space_globs() -> None:
    """Every object ARN in the identity module is `bucket_arn/<a key space glob>`."""
    text = folder_text(IDENTITY)
    object_arns = re.findall(r"\$\{var\.bucket_arn\}/([^\"]*)\"", text)
    assert object_arns, "the policies name no object resources"
    assert all(a == "${local.key_space_globs[s]}" for a in object_arns), object_arns
    assert "s3:prefix" in text and "key_space_globs[s]" in text  # listing is scoped too
    # The roots (for a role that lists a whole key space) are the code's roots too.
    roots = {k: unq(v) for k, v in fields(_locals()["key_space_roots"]).items()}
    assert roots == {ks.name: ks.template.split("/")[0] + "/*" for ks in KEY_SPACES}
    # No stray literal key prefix anywhere else in the identity module.
    for ks in KEY_SPACES:
        root = ks.template.split("/")[0] + "/"
        assert text.count(f'"{root}') == 2, f"{root} written outside key_space_globs/roots"


def test_the_code_builds_keys_inside_its_key_spaces() -> None:
    t, a = uuid.uuid4(), uuid.uuid4()
    version = object_keys.adapter_version_prefix(t, a, 3)
    assert version == f"tenants/{t}/adapters/{a}/v3/"
    assert fnmatch.fnmatchcase(
        version + "adapter_model.safetensors", object_keys.ADAPTERS.iam_glob()
    )
    assert not fnmatch.fnmatchcase(version + "x", object_keys.MODELS.iam_glob())
    model = object_keys.model_prefix("llama-8b")
    assert fnmatch.fnmatchcase(model + "config.json", object_keys.MODELS.iam_glob())
    assert object_keys.is_adapter_key(object_keys.adapter_prefix(t, a))
    assert not object_keys.is_adapter_key(f"tenants/{t}/")
    assert not object_keys.is_adapter_key(model)


def test_identity_service_accounts_are_the_manifests() -> None:
    """The IRSA trust names the service accounts the Kubernetes templates create."""
    from support.infra import all_docs

    accounts = {d["metadata"]["name"]: d for d in all_docs() if d["kind"] == "ServiceAccount"}
    roles = {unq(k) for k in fields(_locals()["access"])} | {"secrets"}
    annotated = {
        name for name, d in accounts.items()
        if "eks.amazonaws.com/role-arn" in (d["metadata"].get("annotations") or {})
    }  # fmt: skip
    assert annotated == {f"loraplex-{r}" for r in roles}
    outputs = blocks(IDENTITY, "output")
    assert "service_account_role_arns" in outputs
