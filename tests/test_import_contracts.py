"""The dependency direction holds: import-linter's contracts (pyproject.toml
`[tool.importlinter]`) pass on the project, and the same contracts fail on a throwaway copy of
the layout that imports the wrong way, so they can fail at all."""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

import pytest
from support.import_tree import REPO, lint_imports, package_tree

FIXTURE = "lpxfixture"
# One module per layer the contracts name (optional layers left out, as on a branch without them).
FIXTURE_MODULES = [
    "api/app.py", "migrations/env.py", "adapters/weights.py", "moe/layer.py",
    "loader/stream.py", "platform/cli.py", "bench/run.py", "platform/up.py",
    "platform/up_replica.py", "platform/gateway/router.py", "platform/jobs/tasks.py",
    "platform/engine/core.py", "platform/services/adapters.py", "platform/db/models.py",
    "platform/settings.py", "platform/embedded/process.py", "platform/demo_model.py",
    "platform/engine_spec/config.py", "bench/_synthetic/models.py", "bench/common.py",
    "platform/local_processes.py", "platform/supervisor.py", "platform/child_env.py",
    "platform/replica_secret.py", "platform/wire/messages.py", "platform/tokenizing/chat.py",
    "platform/http_errors.py", "platform/object_keys.py", "platform/secret_files.py",
    "platform/errors.py", "platform/opcli/commands.py", "platform/launcher/local.py",
    "platform/graceful.py", "infra/k8s/render.py", "platform/launcher/k8s.py",
    "platform/engine/server.py", "platform/engine/engine_process.py",
    "platform/engine/engine_loop.py", "platform/engine/ep_engine.py",
    "platform/engine/llm.py", "platform/engine/engine_core.py", "platform/engine/model_runner.py",
    "platform/engine/scheduler.py", "platform/engine/prefix_cache.py",
    "platform/engine/block_pool.py", "platform/engine/models/llama.py",
    "platform/engine/layers/linear.py", "platform/engine/lora/runtime.py",
    "platform/engine/kv_cache.py",
]  # fmt: skip
# Imports that follow the direction: the fixture passes with these alone.
GOOD = {
    "api/app.py": ["platform.services.adapters", "platform.gateway.router"],
    "platform/gateway/router.py": ["platform.services.adapters", "platform.engine_spec.config"],
    "platform/engine/core.py": ["platform.engine_spec.config", "adapters.weights", "moe.layer"],
    "platform/services/adapters.py": ["platform.db.models", "platform.settings"],
    "adapters/weights.py": ["loader.stream"],
    "bench/run.py": ["bench.common", "platform.up", "api.app"],
    "platform/cli.py": ["platform.opcli.commands"],
    "platform/launcher/k8s.py": ["infra.k8s.render", "platform.engine_spec.config"],
    "platform/engine/server.py": ["platform.engine.engine_process", "platform.engine.engine_loop"],
    "platform/engine/engine_process.py": [
        "platform.engine.engine_loop",
        "platform.engine.ep_engine",
    ],
    "platform/engine/ep_engine.py": ["platform.engine.engine_core"],
    "platform/engine/llm.py": ["platform.engine.engine_core"],
    "platform/engine/engine_core.py": ["platform.engine.model_runner", "platform.engine.scheduler"],
    "platform/engine/model_runner.py": [
        "platform.engine.models.llama",
        "platform.engine.scheduler",
    ],
    "platform/engine/scheduler.py": ["platform.engine.prefix_cache"],
    "platform/engine/prefix_cache.py": ["platform.engine.block_pool"],
    "platform/engine/models/llama.py": ["platform.engine.layers.linear"],
}


def _contracts_config(dest: Path) -> Path:
    """This project's contracts, aimed at the fixture package."""
    text = (REPO / "pyproject.toml").read_text()
    section = text[text.index("[tool.importlinter]") :]
    tomllib.loads(section)  # the contracts are the file's last tables
    dest.write_text(re.sub(r"\bloraplex\b", FIXTURE, section))
    return dest


def _fixture(tmp_path: Path, wrong: tuple[str, str] | None) -> Path:
    src = tmp_path / "src"
    for rel in FIXTURE_MODULES:
        path = src / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        for parent in path.relative_to(src).parents[:-1]:
            if parent.parts[0] != "platform" or len(parent.parts) > 1:
                (src / parent / "__init__.py").touch()
        imports = list(GOOD.get(rel, []))
        if wrong is not None and wrong[0] == rel:
            imports.append(wrong[1])
        path.write_text("".join(f"import {FIXTURE}.{m}\n" for m in imports))
    folders = {p.name: p for p in src.iterdir()}
    return package_tree(tmp_path / "tree", FIXTURE, folders)


def test_the_project_keeps_every_contract() -> None:
    out = lint_imports(REPO, REPO / "pyproject.toml")  # plain `lint-imports` at the repo root
    assert out.returncode == 0, out.stdout + out.stderr
    assert re.search(r"Contracts: \d+ kept, 0 broken", out.stdout), out.stdout


def test_the_contracts_pass_a_layout_that_imports_the_right_way(tmp_path: Path) -> None:
    out = lint_imports(_fixture(tmp_path, None), _contracts_config(tmp_path / "c.toml"))
    assert out.returncode == 0, out.stdout + out.stderr


@pytest.mark.parametrize(
    ("wrong", "broken"),
    [
        (("platform/engine/core.py", "platform.db.models"), "the engine never imports"),
        (("platform/services/adapters.py", "platform.jobs.tasks"), "platform: launchers"),
        (("loader/stream.py", "platform.settings"), "api -> platform"),
        (("platform/gateway/router.py", "platform.engine.core"), "control plane and gateway"),
        (("bench/common.py", "bench.run"), "no import cycles"),
        (("platform/cli.py", "bench.run"), "never import the benchmarks"),
        (("loader/stream.py", "bench.common"), "never import the benchmarks"),
        (("platform/engine/llm.py", "bench._synthetic.models"), "never import the benchmarks"),
        (("infra/k8s/render.py", "platform.engine_spec.config"), "infra imports no other part"),
        (("platform/gateway/router.py", "infra.k8s.render"), "only the launcher imports infra"),
        (("platform/engine/layers/linear.py", "platform.engine.engine_core"), "model code"),
        (("platform/engine/models/llama.py", "platform.engine.server"), "model code"),
        (("platform/engine/scheduler.py", "platform.engine.models.llama"), "scheduling"),
        (("platform/engine/block_pool.py", "platform.engine.layers.linear"), "scheduling"),
        (("platform/engine/engine_core.py", "platform.engine.server"), "engine: server"),
        (("platform/engine/engine_loop.py", "platform.engine.engine_process"), "engine: server"),
    ],
)
def test_a_wrong_import_breaks_a_contract(tmp_path: Path, wrong, broken: str) -> None:
    out = lint_imports(_fixture(tmp_path, wrong), _contracts_config(tmp_path / "c.toml"))
    assert out.returncode != 0, out.stdout
    found = out.stdout.split("Broken contracts")[-1]
    assert broken in found and wrong[1].rpartition(".")[2] in found, out.stdout
