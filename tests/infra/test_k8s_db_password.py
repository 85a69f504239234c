"""The database password reaches the pods as a file, not in an environment variable: the URL
External Secrets renders holds no password and names the file, and every pod that reads the
URL mounts the Secret that holds it (rotation is tested against PostgreSQL in
tests/platform/db/test_db_password_rotation.py)."""

from __future__ import annotations

from pathlib import PurePosixPath
from urllib.parse import parse_qs, urlsplit

from support.infra import pod_spec, rendered


def _docs(env: str) -> list[dict]:
    return rendered()[f"{env}/platform.yaml"] + rendered()[f"{env}/models-admin.yaml"]


def test_the_database_url_names_a_mounted_password_file() -> None:
    for env in ("dev", "prod"):
        docs = _docs(env)
        [platform] = [d for d in docs if d["kind"] == "ExternalSecret"
                      and d["metadata"]["name"] == "loraplex-platform"]  # fmt: skip
        url = platform["spec"]["target"]["template"]["data"]["LORAPLEX_DATABASE_URL"]
        parts = urlsplit(url)
        assert "db_password" not in url and ":" not in parts.netloc.split("@")[0]
        [path] = parse_qs(parts.query)["password_file"]
        folder, key = str(PurePosixPath(path).parent), PurePosixPath(path).name
        [secret] = [d for d in docs if d["kind"] == "ExternalSecret"
                    and d["metadata"]["name"] == "loraplex-db-password"]  # fmt: skip
        assert [x["secretKey"] for x in secret["spec"]["data"]] == [key]
        readers = 0
        for doc in docs:
            spec = pod_spec(doc)
            if spec is None:
                continue
            for c in spec["containers"]:
                env_refs = [e.get("secretRef", {}).get("name") for e in c.get("envFrom", [])]
                direct = [e for e in c.get("env", []) if e["name"] == "LORAPLEX_DATABASE_URL"]
                if "loraplex-platform" not in env_refs and not direct:
                    continue
                readers += 1
                mounts = {m["name"]: m["mountPath"] for m in c.get("volumeMounts", [])}
                assert mounts.get("db-password") == folder, (doc["metadata"]["name"], c["name"])
                [volume] = [v for v in spec["volumes"] if v["name"] == "db-password"]
                assert volume["secret"]["secretName"] == "loraplex-db-password"
        assert readers >= 5  # api, worker, migration, launcher, models-admin
