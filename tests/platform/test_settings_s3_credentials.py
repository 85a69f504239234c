"""`s3_static_credentials=False` (what the Kubernetes manifests set for IRSA): both S3
clients sign with boto3's default credential chain, not the settings' key pair."""

from __future__ import annotations

import pytest

from loraplex.loader.object_store import ObjectStore
from loraplex.platform.services import objects


def test_default_chain_signs_when_static_credentials_are_off(
    settings, s3_prefix: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The chain finds the real keys in the environment (on EKS: the web identity token);
    # the settings carry a wrong pair that would be refused if it were used.
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", settings.s3_access_key)
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", settings.s3_secret_key)
    wrong = settings.model_copy(update={"s3_access_key": "nobody", "s3_secret_key": "wrong"})
    ambient = wrong.model_copy(update={"s3_static_credentials": False})
    assert ambient.s3_credentials() == {}

    key = f"{s3_prefix}hello.txt"
    objects.s3_client(ambient).put_object(Bucket=settings.s3_bucket, Key=key, Body=b"hello")
    assert ObjectStore(ambient.storage()).get_range(key, 0, 5) == b"hello"
    # Control: with static credentials on, the wrong pair is what signs, and S3 refuses it.
    with pytest.raises(Exception, match="(?i)access|denied|signature|invalid"):
        objects.s3_client(wrong).put_object(Bucket=settings.s3_bucket, Key=key, Body=b"x")
