"""The engine pods keep weights (and Triton's compiled kernels) on a shared file system, so a
replica's second cold start does not re-stream the model from S3.

The namespace enforces Pod Security "restricted", which refuses hostPath volumes
(https://kubernetes.io/docs/concepts/security/pod-security-standards/, "Volume Types":
restricted allows configMap, csi, downwardAPI, emptyDir, ephemeral, persistentVolumeClaim,
projected, secret), so the node-local copy is an EFS file system mounted through a statically
provisioned PersistentVolume (https://github.com/kubernetes-sigs/aws-efs-csi-driver, "Static
provisioning": `csi.driver: efs.csi.aws.com`, `volumeHandle: <file system id>`)."""

from __future__ import annotations

import re

from support.infra import (
    TERRAFORM,
    blocks,
    example_outputs,
    folder_text,
    pod_spec,
    release,
    rendered,
    unq,
    validate_resource,
)

from loraplex.platform.settings import Settings

MODULE = TERRAFORM / "modules" / "weights_cache"


def _engine(env: str) -> dict:
    [dep] = [d for d in rendered()[f"{env}/engine-llama-8b.yaml"] if d["kind"] == "Deployment"]
    return dep


def _platform(env: str, kind: str) -> list[dict]:
    return [d for d in rendered()[f"{env}/platform.yaml"] if d["kind"] == kind]


def test_the_engine_reads_weights_through_the_cache_on_the_shared_volume() -> None:
    for env in ("dev", "prod"):
        spec = pod_spec(_engine(env))
        [volume] = [v for v in spec["volumes"] if v["name"] == "weights-cache"]
        claim = volume["persistentVolumeClaim"]["claimName"]
        [pvc] = [
            d for d in _platform(env, "PersistentVolumeClaim") if d["metadata"]["name"] == claim
        ]
        [pv] = [d for d in _platform(env, "PersistentVolume")
                if d["metadata"]["name"] == pvc["spec"]["volumeName"]]  # fmt: skip
        for doc in (pvc, pv):
            validate_resource(doc)
        assert pvc["spec"]["accessModes"] == ["ReadWriteMany"] == pv["spec"]["accessModes"]
        assert pv["spec"]["csi"]["driver"] == "efs.csi.aws.com"
        fs_id = example_outputs()["weights_cache_file_system_id"]
        handle = example_outputs()["weights_cache_volume_handle"]
        assert pv["spec"]["csi"]["volumeHandle"] == handle and handle.startswith(fs_id + "::fsap-")
        assert pv["spec"]["claimRef"] == {"namespace": "loraplex", "name": claim}
        [engine] = [c for c in spec["containers"] if c["name"] == "engine"]
        [mount] = [m for m in engine["volumeMounts"] if m["name"] == "weights-cache"]
        env_vars = {e["name"]: e.get("value") for e in engine["env"]}
        cache_dir = env_vars["LORAPLEX_WEIGHTS_CACHE_DIR"]
        assert cache_dir.startswith(mount["mountPath"] + "/")
        assert env_vars["TRITON_CACHE_DIR"].startswith(mount["mountPath"] + "/")
        limit = release(env).values["engine"]["weights_cache"]["max_bytes"]
        assert int(env_vars["LORAPLEX_WEIGHTS_CACHE_MAX_BYTES"]) == limit
        # What the engine process makes of them: the loader's cache settings.
        storage = Settings(weights_cache_dir=cache_dir, weights_cache_max_bytes=limit).storage()
        assert (storage.local_cache_dir, storage.local_cache_max_bytes) == (cache_dir, limit)


def test_terraform_makes_the_file_system_and_lets_only_the_nodes_mount_it() -> None:
    resources = blocks(MODULE, "resource")
    text = folder_text(MODULE)
    assert "aws_efs_file_system" in str(resources)
    assert re.search(r"encrypted\s*=\s*true", text)
    assert re.search(r'throughput_mode\s*=\s*"elastic"', text)
    assert "aws_efs_mount_target" in str(resources)
    # The pods run as 10001 (a new file system's root is root's): an access point owns their dir.
    assert "aws_efs_access_point" in str(resources) and re.search(r"uid\s*=\s*10001", text)
    # NFS from the EKS nodes' security group only.
    assert re.search(r"from_port\s*=\s*2049", text) and "var.client_security_group_id" in text
    stack = folder_text(TERRAFORM / "stack")
    assert re.search(r'module "weights_cache"', stack)
    assert re.search(r'output "weights_cache_file_system_id"', stack)
    # The EFS CSI driver is an EKS add-on with a pinned build in every environment.
    cluster = folder_text(TERRAFORM / "modules" / "cluster")
    assert 'var.addon_versions["aws-efs-csi-driver"]' in cluster
    for env in ("dev", "prod"):
        module = next(iter(blocks(TERRAFORM / "envs" / env, "module").values()))
        assert "aws-efs-csi-driver" in str(unq(module["addon_versions"])), env
