"""`loraplex models add|demo` as a user runs them, against the real services."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from loraplex.platform.demo_model import make_demo_model

CLI = [sys.executable, "-m", "loraplex.platform.cli"]


def _env(settings, database_url: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("LORAPLEX_")}
    env |= {
        "LORAPLEX_DATABASE_URL": database_url,
        "LORAPLEX_S3_ENDPOINT_URL": settings.s3_endpoint_url,
        "LORAPLEX_S3_BUCKET": settings.s3_bucket,
        "LORAPLEX_BROKER_URL": settings.broker_url,
    }
    return env


def test_models_demo_writes_a_folder(tmp_path: Path) -> None:
    out = subprocess.run(
        [*CLI, "models", "demo", "--out", str(tmp_path / "m")],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 0, out.stderr
    assert Path(out.stdout.strip()) == tmp_path / "m"
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForCausalLM"]


def test_models_add_uploads_and_registers(
    settings, pg_fresh_url: str, s3_client, tmp_path: Path
) -> None:
    import sqlalchemy as sa

    from loraplex.platform.db.migrate import upgrade

    upgrade(pg_fresh_url)
    folder = make_demo_model(tmp_path / "tiny")
    name = f"cli-{tmp_path.name[-8:].lower().replace('_', '-')}"
    env = _env(settings, pg_fresh_url)
    out = subprocess.run(
        [*CLI, "models", "add", name, str(folder)], env=env, capture_output=True, text=True,
        timeout=120,
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    assert f"registered base model {name!r} (dense)" in out.stdout
    listed = s3_client.list_objects_v2(Bucket=settings.s3_bucket, Prefix=f"models/{name}/")
    keys = {o["Key"].rsplit("/", 1)[1] for o in listed.get("Contents", [])}
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= keys
    engine = sa.create_engine(pg_fresh_url)
    with engine.connect() as conn:
        family = conn.execute(
            sa.text("SELECT family FROM base_models WHERE name = :n"), {"n": name}
        ).scalar_one()
    engine.dispose()
    assert family == "dense"

    missing = subprocess.run(
        [*CLI, "models", "add", name, str(tmp_path / "nowhere")], env=env, capture_output=True,
        text=True, timeout=120,
    )  # fmt: skip
    assert missing.returncode == 2
    assert "not a directory" in missing.stderr


def test_models_add_refuses_an_architecture_the_engine_cannot_serve(
    settings, pg_fresh_url: str, s3_client, tmp_path: Path
) -> None:
    from loraplex.platform.db.migrate import upgrade

    upgrade(pg_fresh_url)
    folder = make_demo_model(tmp_path / "gpt2ish")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["GPT2LMHeadModel"]
    (folder / "config.json").write_text(json.dumps(config))
    name = f"bad-{tmp_path.name[-8:].lower().replace('_', '-')}"
    out = subprocess.run(
        [*CLI, "models", "add", name, str(folder)], env=_env(settings, pg_fresh_url),
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert out.returncode != 0
    assert "unsupported model architecture GPT2LMHeadModel" in out.stderr
    assert "LlamaForCausalLM" in out.stderr  # names what is supported
    listed = s3_client.list_objects_v2(Bucket=settings.s3_bucket, Prefix=f"models/{name}/")
    assert listed.get("KeyCount", 0) == 0  # nothing uploaded for a refused model
