"""What the gateway adds per streamed chunk, against calling the replica directly (part of
`loraplex bench serve`).

Same run, same replica, same greedy request (prompt token ids, so both paths send the engine
the same tokens), streamed alternately through the gateway (`/v1/completions`) and straight
from the replica (`/generate`, wire format, the replica secret); each run times its chunks on
arrival. Per run, the time per chunk while streaming is (last chunk - first chunk) / (chunks
- 1), and the gateway's overhead is its time per chunk minus the direct one: the p50 of those
paired differences is `gateway_overhead_ms_p50` (target: at most 1 ms). The first chunk's
extra delay (authentication, model resolution, tokenization, routing) is reported apart, as
it is paid once per request, not per chunk.

Streaming is pipelined: a per-chunk cost smaller than the engine's step time delays every
chunk by the same amount rather than widening the gaps. So the gateway's own CPU time per
chunk (parse a wire event, build the OpenAI chunk, encode the SSE frame) is measured too,
in-process, best of several (`gateway_chunk_cpu_ms`).
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time
import uuid
from dataclasses import dataclass

import httpx

from loraplex.platform.wire import (
    WIRE_VERSION,
    WIRE_VERSION_HEADER,
    DeltaEvent,
    GenerateRequest,
    SamplingOptions,
    decode_event,
    encode_event,
)
from loraplex.platform.wire.auth import bearer

PROMPT_IDS = list(range(100, 164))  # token ids every tokenizer of a real model has


@dataclass
class Timed:
    """One streamed request: when it was sent and when each content chunk arrived."""

    start: float
    chunks: list[float]

    @property
    def per_chunk_ms(self) -> float:
        """Mean gap between chunks while streaming."""
        return (self.chunks[-1] - self.chunks[0]) * 1000 / (len(self.chunks) - 1)

    @property
    def first_ms(self) -> float:
        """Time to the first chunk."""
        return (self.chunks[0] - self.start) * 1000


async def via_gateway(
    http: httpx.AsyncClient, url: str, key: str, model: str, max_tokens: int
) -> Timed:
    """Stream a greedy text completion of `PROMPT_IDS` through the gateway."""
    body = {"model": model, "prompt": PROMPT_IDS, "max_tokens": max_tokens, "temperature": 0,
            "stream": True}  # fmt: skip
    start, chunks = time.perf_counter(), []
    headers = {"Authorization": f"Bearer {key}"}
    async with http.stream("POST", f"{url}/v1/completions", json=body, headers=headers) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: {") and json.loads(line[6:])["choices"][0]["text"]:
                chunks.append(time.perf_counter())
    return Timed(start, chunks)


async def direct(http: httpx.AsyncClient, replica_url: str, secret: str, max_tokens: int) -> Timed:
    """Stream the same request straight from the replica."""
    req = GenerateRequest(
        request_id=f"bench-{uuid.uuid4().hex}",
        prompt_token_ids=PROMPT_IDS,
        sampling=SamplingOptions(temperature=0.0, max_tokens=max_tokens),
    )
    headers = {WIRE_VERSION_HEADER: str(WIRE_VERSION), "authorization": bearer(secret),
               "content-type": "application/json"}  # fmt: skip
    start, chunks = time.perf_counter(), []
    async with http.stream(
        "POST", f"{replica_url}/generate", content=req.model_dump_json(), headers=headers
    ) as resp:
        resp.raise_for_status()
        async for line in resp.aiter_lines():
            if line.startswith("data: "):
                event = decode_event(line[6:])
                if isinstance(event, DeltaEvent) and event.text:
                    chunks.append(time.perf_counter())
    return Timed(start, chunks)


async def _paired(
    url: str, key: str, model: str, replica_url: str, secret: str, runs: int, max_tokens: int
) -> list[tuple[Timed, Timed]]:
    pairs = []
    async with httpx.AsyncClient(timeout=httpx.Timeout(300.0)) as http:
        await via_gateway(http, url, key, model, max_tokens)  # warm both paths
        await direct(http, replica_url, secret, max_tokens)
        for i in range(runs):
            if i % 2:
                d = await direct(http, replica_url, secret, max_tokens)
                g = await via_gateway(http, url, key, model, max_tokens)
            else:
                g = await via_gateway(http, url, key, model, max_tokens)
                d = await direct(http, replica_url, secret, max_tokens)
            if len(g.chunks) > 2 and len(d.chunks) > 2:
                pairs.append((g, d))
    return pairs


def chunk_path_cpu_ms(chunks: int = 2000, repeats: int = 5) -> float:
    """The gateway's CPU time per chunk (best of `repeats`): decode the replica's wire event
    and write the OpenAI chunk's SSE frame from it (the endpoint's stream writer)."""
    import uuid

    from loraplex.platform.gateway.completion import Job
    from loraplex.platform.gateway.endpoints import TEXT
    from loraplex.platform.wire import GenerateRequest

    wire = GenerateRequest(request_id="cmpl-x-0", prompt_token_ids=[1])
    job = Job(TEXT, "m", None, wire, 1, 1, None, uuid.uuid4(), None, True,  # type: ignore[arg-type]  # writing chunks needs no resolution
              False, cid="cmpl-x")  # fmt: skip
    writer = TEXT.stream_writer(job)
    frame = encode_event(DeltaEvent(token_ids=[1234], text=" word"))[6:-2]
    best = float("inf")
    for _ in range(repeats):
        t0 = time.perf_counter()
        for _ in range(chunks):
            event = decode_event(frame)
            assert isinstance(event, DeltaEvent)
            writer.frame(0, event, None)
        best = min(best, (time.perf_counter() - t0) / chunks)
    return best * 1000


def measure(
    url: str,
    key: str,
    model: str,
    replica_url: str,
    secret: str,
    runs: int = 12,
    max_tokens: int = 48,
) -> dict[str, float]:
    """The gateway's overhead per chunk and per request, with the direct baselines."""
    pairs = asyncio.run(_paired(url, key, model, replica_url, secret, runs, max_tokens))
    if not pairs:
        raise RuntimeError("no run streamed more than two chunks on both paths")
    return {
        "gateway_overhead_ms_p50": statistics.median(
            g.per_chunk_ms - d.per_chunk_ms for g, d in pairs
        ),
        "direct_chunk_ms_p50": statistics.median(d.per_chunk_ms for _, d in pairs),
        "gateway_chunk_ms_p50": statistics.median(g.per_chunk_ms for g, _ in pairs),
        "gateway_first_chunk_overhead_ms_p50": statistics.median(
            g.first_ms - d.first_ms for g, d in pairs
        ),
        "direct_first_chunk_ms_p50": statistics.median(d.first_ms for _, d in pairs),
        "gateway_chunk_cpu_ms": chunk_path_cpu_ms(),
        "overhead_runs": float(len(pairs)),
    }
