"""A platform release does not restart GPU replicas: the engine image is tagged by the content
of what the engine runs (`infra/k8s/engine_tag.py`), so a release that changes only the API
renders the same engine pod template, and Kubernetes starts a rollout only when a
Deployment's pod template changes (https://kubernetes.io/docs/concepts/workloads/controllers/deployment/#updating-a-deployment:
"A Deployment's rollout is triggered if and only if the Deployment's Pod template
(that is, .spec.template) is changed"). An engine rollout keeps serving capacity: it surges
a new replica before an old one stops (maxUnavailable 0, same page, "Rolling Update
Deployment"), and the old one drains before it exits."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

from support.infra import REPO, example_engines, example_outputs, release

from loraplex.infra.k8s import engine_tag
from loraplex.infra.k8s.render import Release, load_values


def _engine_deployment(rel: Release) -> dict:
    from support.infra import documents

    [dep] = [d for d in documents(rel.engine(example_engines()[0])) if d["kind"] == "Deployment"]
    return dep


def _copy_inputs(to: Path) -> Path:
    """The repository's files the tag reads, copied under `to`."""
    for rel in engine_tag.inputs(REPO):
        target = to / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(REPO / rel, target)
    (to / "api").mkdir(exist_ok=True)
    (to / "api" / "routes.py").write_text("API = 1\n")
    return to


def test_an_api_only_release_renders_the_same_engine_pod_template() -> None:
    tag = engine_tag.engine_tag(REPO)
    old = Release(example_outputs(), load_values("dev"), "v1.2.0", engine_tag=tag)
    new = Release(example_outputs(), load_values("dev"), "v1.3.0", engine_tag=tag)
    a, b = _engine_deployment(old), _engine_deployment(new)
    assert a["spec"]["template"] == b["spec"]["template"]
    [engine] = [c for c in a["spec"]["template"]["spec"]["containers"] if c["name"] == "engine"]
    assert engine["image"].endswith(f"/engine:{tag}")
    # The platform's own workloads do move to the new release.
    assert "v1.3.0" in new.render("api") and "v1.3.0" not in old.render("api")


def test_the_engine_tag_follows_the_engines_content_only(tmp_path: Path) -> None:
    tree = _copy_inputs(tmp_path / "repo")
    before = engine_tag.engine_tag(tree)
    assert before == engine_tag.engine_tag(tree)  # stable
    (tree / "api" / "routes.py").write_text("API = 2\n")  # an API-only change
    assert engine_tag.engine_tag(tree) == before
    kernel = tree / "platform" / "engine" / "scheduler.py"
    kernel.write_text(kernel.read_text() + "\n# changed\n")
    assert engine_tag.engine_tag(tree) != before
    assert engine_tag.engine_tag(tree).startswith("engine-")


def test_the_tag_covers_every_module_the_engine_imports() -> None:
    """Derived, not listed: every repository file that importing the engine's server and the
    replica agent loads is among the tag's inputs."""
    code = (
        "import sys, loraplex.platform.engine.server, loraplex.platform.gateway.replica_agent\n"
        "for m in list(sys.modules.values()):\n"
        "    f = getattr(m, '__file__', None)\n"
        "    if f: print(f)\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True, timeout=300).stdout.split()  # fmt: skip
    loaded = set()
    for path in out:
        p = Path(path).resolve()
        if p.is_file() and p.is_relative_to(REPO) and ".venv" not in p.parts:
            loaded.add(str(p.relative_to(REPO)))
    assert any(p.startswith("platform/engine/") for p in loaded)
    covered = {str(p) for p in engine_tag.inputs(REPO)}
    assert loaded <= covered, sorted(loaded - covered)


def test_an_engine_rollout_keeps_serving_capacity() -> None:
    for env in ("dev", "prod"):
        dep = _engine_deployment(release(env))
        strategy = dep["spec"]["strategy"]
        assert strategy["type"] == "RollingUpdate"
        rolling = strategy["rollingUpdate"]
        # One replica (or the last ready one) never goes before its replacement is ready.
        assert rolling["maxUnavailable"] == 0 and rolling["maxSurge"] >= 1
        spec = dep["spec"]["template"]["spec"]
        [engine] = [c for c in spec["containers"] if c["name"] == "engine"]
        assert engine["lifecycle"]["preStop"]  # deregister, then drain
        assert spec["terminationGracePeriodSeconds"] >= release(env).values["engine"][
            "drain_timeout_s"]  # fmt: skip
