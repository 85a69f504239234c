"""The README quickstart as written: `loraplex up`, then `tenants create`, `keys create`,
`demo adapter`, `adapters push` with the CLI, then a chat call with the `openai` SDK whose
greedy answer with the adapter differs from the base model's (the adapter is applied)."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from support.opcli import OperatorShell, running_up

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


@pytest.mark.slow
def test_readme_quickstart_with_the_cli(service_tmp_path: Path, tmp_path: Path) -> None:
    import openai

    with running_up(service_tmp_path / "data") as (url, admin_key):
        admin = OperatorShell(url, admin_key)
        admin.ok("tenants", "create", "acme", "--rpm", "600")
        key = admin.ok("keys", "create", "acme", "--name", "dev", "--quiet").stdout.strip()
        tenant = OperatorShell(url, admin_key, key)
        adapter = tenant.ok("demo", "adapter", "--out", str(tmp_path / "demo-adapter"))
        pushed = tenant.ok(
            "adapters", "push", adapter.stdout.strip(), "--name", "my-adapter",
            "--base-model", "demo",
        )  # fmt: skip
        assert "my-adapter v1 is ready" in pushed.stdout
        assert "my-adapter" in tenant.ok("adapters", "list").stdout
        client = openai.OpenAI(base_url=f"{url}/v1", api_key=key, max_retries=0, timeout=120)
        base = _greedy(client, "demo")
        tuned = _greedy(client, "my-adapter")
        assert len(base) == len(tuned) == 8
        assert base != tuned, "the demo adapter should change the demo model's answer"
        assert _greedy(client, "my-adapter:1") == tuned
