"""The benchmarks' chat client: one streamed chat completion, timed token by token, and the
words their prompts are made of (`bench serve`, `bench load`, first requests)."""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field

import httpx

WORDS = [
    "the",
    "library",
    "opens",
    "at",
    "nine",
    "in",
    "the",
    "morning",
    "and",
    "closes",
    "at",
    "six",
    "in",
    "the",
    "evening",
    "every",
    "visitor",
    "signs",
    "the",
    "book",
    "by",
    "the",
    "door",
    "then",
    "walks",
    "past",
    "the",
    "long",
    "tables",
    "to",
    "the",
    "shelves",
    "on",
    "rainy",
    "days",
]


@dataclass
class Outcome:
    """What one request measured."""

    ok: bool
    ttft: float = 0.0
    itls: list[float] = field(default_factory=list)
    tokens: int = 0
    error: str | None = None


async def one_request(
    http: httpx.AsyncClient, url: str, key: str, model: str, prompt: str, max_tokens: int
) -> Outcome:
    """Stream one chat completion and time its tokens."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        "stream": True,
        "stream_options": {"include_usage": True},
    }
    start = time.perf_counter()
    first: float | None = None
    last = start
    itls: list[float] = []
    tokens = 0
    try:
        async with http.stream(
            "POST",
            f"{url}/v1/chat/completions",
            json=body,
            headers={"Authorization": f"Bearer {key}"},
        ) as resp:
            if resp.status_code != 200:
                return Outcome(
                    False, error=f"HTTP {resp.status_code}: {(await resp.aread())[:200]!r}"
                )
            async for line in resp.aiter_lines():
                if not line.startswith("data: {"):
                    continue
                # Parsed only where it says something the client needs (an error, the usage):
                # on a shared machine the measuring client's own CPU is taken from the server.
                if line.startswith('data: {"error"') or '"usage":{' in line:
                    chunk = json.loads(line[6:])
                    if "error" in chunk:
                        return Outcome(False, error=str(chunk["error"].get("message")))
                    if chunk.get("usage"):
                        tokens = int(chunk["usage"]["completion_tokens"])
                if '"delta":{"content":"' in line and '"delta":{"content":""' not in line:
                    now = time.perf_counter()
                    if first is None:
                        first = now
                    else:
                        itls.append(now - last)
                    last = now
    except httpx.HTTPError as exc:
        return Outcome(False, error=repr(exc))
    if first is None:
        return Outcome(False, error="no content")
    return Outcome(True, first - start, itls, tokens)
