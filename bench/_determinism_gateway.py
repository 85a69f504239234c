"""`bench determinism`'s gateway count: identical requests sent at once through the platform.

A fresh local stack (`serve_stack.local_stack`: PostgreSQL, SeaweedFS, Redis, a worker, the
API and one replica of the demo model) whose deployment has the deterministic option on or
off; `requests` copies of one greedy chat completion with logprobs go to the gateway at once,
and the answers (text and every logprob, as the JSON carries them) are counted by distinct
value. Requests the platform refuses (429/503) are sent again after its Retry-After, and
those whose connection drops are sent again; the bench reports how many sends were repeated.
"""

from __future__ import annotations

import asyncio
import json

import httpx

PROMPT = "Tell me about the weather in the mountains in winter."


async def _ask(
    http: httpx.AsyncClient, url: str, key: str, body: dict, resent: dict[str, int]
) -> str:
    """One completion's answer as a canonical string (text and logprobs); each repeated send
    is counted in `resent` by why ("dropped" connections, "refused" with 429/503)."""
    for _ in range(100):
        try:
            r = await http.post(
                f"{url}/v1/chat/completions", json=body, headers={"Authorization": f"Bearer {key}"}
            )
        except httpx.TransportError:
            resent["dropped"] += 1
            await asyncio.sleep(0.5)
            continue
        if r.status_code in (429, 503):
            resent["refused"] += 1
            await asyncio.sleep(float(r.headers.get("Retry-After", "0.5") or 0.5))
            continue
        r.raise_for_status()
        choice = r.json()["choices"][0]
        return json.dumps([choice["message"]["content"], choice["logprobs"]], sort_keys=True)
    raise RuntimeError("an identical request failed 100 times (429/503 or dropped connections)")


async def _send_all(
    url: str, key: str, requests: int, max_tokens: int
) -> tuple[list[str], dict[str, int]]:
    body = {
        "model": "demo",
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "logprobs": True,
        "top_logprobs": 2,
    }
    resent = {"refused": 0, "dropped": 0}
    limits = httpx.Limits(max_connections=requests + 8)
    async with httpx.AsyncClient(timeout=httpx.Timeout(900.0), limits=limits) as http:
        answers = await asyncio.gather(
            *(_ask(http, url, key, body, resent) for _ in range(requests))
        )
    return answers, resent


def gateway_distinct_outputs(
    deterministic: bool, requests: int, max_tokens: int
) -> tuple[int, dict[str, int]]:
    """(distinct answers, repeated sends by why) over `requests` identical concurrent requests through
    a fresh stack whose deployment runs with the deterministic option `deterministic`."""
    from loraplex.bench.serve_stack import local_stack

    with local_stack(0, deterministic=deterministic) as info:
        url, key = info[0], info[1]
        models = httpx.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"}).json()
        shown = {d.get("deterministic") for m in models["data"] for d in m.get("deployments", [])}
        if shown and shown != {deterministic}:
            raise RuntimeError(f"/v1/models shows deterministic {shown}, asked {deterministic}")
        answers, resent = asyncio.run(_send_all(url, key, requests, max_tokens))
    return len(set(answers)), resent
