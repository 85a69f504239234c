"""The README quickstart as written: `loraplex up`, then its printed `export` lines and the
README's block (`tenants create`, `keys create`, `demo adapter`, `adapters push`, `curl`) pasted
into a fresh shell, then a chat call with the `openai` SDK whose greedy answer with the adapter
differs from the base model's (the adapter is applied)."""

from __future__ import annotations

import subprocess
import time
from pathlib import Path

import pytest
from support.opcli import running_up

REPLICA_WAIT_S = 240


def _greedy(client, model: str) -> list[float]:
    """The chosen tokens' logprobs of a greedy answer, waiting out 503s while no replica is
    live yet (up starts the engine after the API)."""
    import openai

    deadline = time.monotonic() + REPLICA_WAIT_S
    while True:
        try:
            resp = client.chat.completions.create(
                model=model,
                messages=[{"role": "user", "content": "hi"}],
                max_tokens=8,
                temperature=0,
                logprobs=True,
            )
        except openai.APIStatusError as exc:
            if exc.status_code != 503 or time.monotonic() > deadline:
                raise
            time.sleep(1)
            continue
        return [(t.token, round(t.logprob, 4)) for t in resp.choices[0].logprobs.content]


README = Path(__file__).parents[3] / "README.md"


def readme_quickstart() -> str:
    """The README's quickstart block, as written (the sh block after `<!-- quickstart -->`)."""
    text = README.read_text(encoding="utf-8")
    after = text.split("<!-- quickstart -->", 1)[1]
    return after.split("```sh\n", 1)[1].split("```", 1)[0]


def _exports(lines: list[str]) -> str:
    """The `export` lines `up` printed for another shell, once all three are out."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        found = [ln.strip() for ln in list(lines) if ln.strip().startswith("export ")]
        if len(found) == 3 and any("LORAPLEX_ADMIN_KEY=" in ln for ln in found):
            return "\n".join(found)
        time.sleep(0.1)
    raise AssertionError("up did not print its export lines:\n" + "\n".join(lines))


@pytest.mark.slow
def test_readme_quickstart_pasted_into_a_fresh_shell(
    service_tmp_path: Path, tmp_path: Path
) -> None:
    """`up`'s printed export lines, then the README block exactly as written, in a new shell
    (an empty environment: no venv on its PATH, no LORAPLEX_* variables); then the `openai`
    SDK with the key that block made: the adapter changes the demo model's greedy answer."""
    import openai

    lines: list[str] = []
    with running_up(service_tmp_path / "data", printed_lines=lines) as (url, _):
        script = _exports(lines) + "\n" + readme_quickstart()
        script += '\necho "the key: $LORAPLEX_API_KEY"\n'
        home = tmp_path / "home"
        home.mkdir()
        env = {"HOME": str(home), "PATH": "/usr/bin:/bin", "LANG": "C.UTF-8"}
        done = subprocess.run(["bash", "--norc", "--noprofile", "-e", "-c", script], env=env,
                              cwd=home, capture_output=True, text=True, timeout=600)  # fmt: skip
        assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
        assert "my-adapter v1 is ready" in done.stdout and '"choices"' in done.stdout
        key = done.stdout.rsplit("the key: ", 1)[1].strip()
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
        base = _greedy(client, "demo")
        tuned = _greedy(client, "my-adapter")
        assert len(base) == len(tuned) == 8
        assert base != tuned, "the demo adapter should change the demo model's answer"
        assert _greedy(client, "my-adapter:1") == tuned


def test_the_quickstart_block_is_what_the_test_runs() -> None:
    """The block is found and holds the steps (a README edit that loses it fails here)."""
    block = readme_quickstart()
    for step in ("tenants create", "keys create", "demo adapter", "adapters push", "curl"):
        assert step in block
