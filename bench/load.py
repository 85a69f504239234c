"""`loraplex bench load`: many concurrent streams over many adapters through the gateway.

`--streams` clients (default 200) each stream chat completions back to back for `--duration`
seconds (default 60), every request to a random one of `--adapters` adapters (default 50).
Some clients read slowly (`--slow-fraction`, sleeping between chunks) and some hang up after
the first chunk (`--drop-fraction`): the platform must abort those on the replica and keep
serving the rest. Every request has a deadline (`--request-deadline`): a client that waits past
it counts as an error ("hung"), so a stuck stream cannot hide.

Baseline, measured in the same run before the load: the TTFT of requests sent one at a time
(`--baseline-requests`), so `load.ttft_p95_ratio` says what the load costs.

At the end the replica must go back to idle: no running or waiting request, no KV block in use,
no adapter reference held. RESULT lines:
  load.requests, load.error_rate, load.ttft_p50_ms, load.ttft_p95_ms, load.baseline_ttft_p95_ms,
  load.ttft_p95_ratio, load.output_tps, load.littles_law_ms (the time in system that the
  measured completion rate implies for this many streams) and load.ttft_p95_over_littles_law,
  load.kv_blocks_in_use_end, load.adapter_references_end,
  load.idle_after_s, and load.errors.<kind> (e.g. http_503_no_replica_available) per kind

Without `--url`, the whole stack runs locally (`serve_stack.local_stack`: embedded PostgreSQL,
SeaweedFS, Redis, a worker, the API and one replica of the demo model, adapters uploaded and
validated through the tenant API).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import re
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx

from loraplex.bench.completion_client import WORDS
from loraplex.bench.serve import console, discover, pct
from loraplex.platform.wire import WIRE_VERSION, WIRE_VERSION_HEADER, ReplicaState
from loraplex.platform.wire.auth import bearer


@dataclass
class Tally:
    """What the clients saw."""

    ttfts: list[float] = field(default_factory=list)
    tokens: int = 0
    ok: int = 0
    dropped: int = 0
    errors: list[str] = field(default_factory=list)

    @property
    def requests(self) -> int:
        """Requests that ended (well, dropped on purpose, or with an error)."""
        return self.ok + self.dropped + len(self.errors)


def _body(model: str, prompt: str, max_tokens: int, seed: int) -> dict[str, Any]:
    return {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 1.0,
        "seed": seed,
        "stream": True,
        "stream_options": {"include_usage": True},
    }


async def _stream(
    http: httpx.AsyncClient, url: str, key: str, body: dict[str, Any], mode: str, slow_s: float
) -> tuple[str, float | None, int]:
    """One streamed request: ("ok" | "dropped" | error text, TTFT seconds, output tokens)."""
    start = time.perf_counter()
    ttft: float | None = None
    tokens = 0
    headers = {"Authorization": f"Bearer {key}"}
    async with http.stream(
        "POST", f"{url}/v1/chat/completions", json=body, headers=headers
    ) as resp:
        if resp.status_code != 200:
            raw = await resp.aread()
            try:
                code = json.loads(raw)["error"]["code"]
            except (ValueError, KeyError, TypeError):
                code = "unknown"
            return f"HTTP {resp.status_code} {code}: {raw[:160]!r}", None, 0
        async for line in resp.aiter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            if "error" in chunk:
                return f"stream error: {chunk['error'].get('message')}", ttft, tokens
            if chunk.get("usage"):
                tokens = int(chunk["usage"]["completion_tokens"])
            if any(c.get("delta", {}).get("content") for c in chunk.get("choices", [])):
                if ttft is None:
                    ttft = time.perf_counter() - start
                    if mode == "drop":
                        return "dropped", ttft, 0  # leaving the block closes the connection
                if mode == "slow":
                    await asyncio.sleep(slow_s)
    if ttft is None:
        return "no content", None, tokens
    return "ok", ttft, tokens


async def _client(
    idx: int,
    http: httpx.AsyncClient,
    url: str,
    key: str,
    models: list[str],
    args: argparse.Namespace,
    stop_at: float,
    tally: Tally,
) -> None:
    rng = random.Random(args.seed * 100_003 + idx)
    draw = rng.random()
    mode = (
        "drop"
        if draw < args.drop_fraction
        else "slow"
        if draw < args.drop_fraction + args.slow_fraction
        else "full"
    )
    n = 0
    while time.monotonic() < stop_at:
        words = " ".join(rng.choice(WORDS) for _ in range(args.prompt_words))
        body = _body(rng.choice(models), words, args.max_tokens, rng.randrange(1 << 30))
        n += 1
        try:
            status, ttft, tokens = await asyncio.wait_for(
                _stream(http, url, key, body, mode, args.slow_delay_ms / 1000),
                timeout=args.request_deadline,
            )
        except TimeoutError:
            status, ttft, tokens = f"hung past {args.request_deadline:.0f} s", None, 0
        except httpx.HTTPError as exc:
            status, ttft, tokens = f"{type(exc).__name__}: {exc}", None, 0
        if status in ("ok", "dropped") and ttft is not None:
            tally.ttfts.append(ttft)
        if status == "ok":
            tally.ok += 1
            tally.tokens += tokens
        elif status == "dropped":
            tally.dropped += 1
        else:
            tally.errors.append(status)


async def run_load(url: str, key: str, models: list[str], args: argparse.Namespace) -> Tally:
    """All clients until `--duration` is over (each finishes its request in flight)."""
    tally = Tally()
    limits = httpx.Limits(max_connections=args.streams + 8, max_keepalive_connections=0)
    timeout = httpx.Timeout(args.request_deadline, connect=30)
    async with httpx.AsyncClient(timeout=timeout, limits=limits) as http:
        stop_at = time.monotonic() + args.duration
        clients = [
            _client(i, http, url, key, models, args, stop_at, tally) for i in range(args.streams)
        ]
        task = asyncio.gather(*clients)
        while not task.done():
            await asyncio.wait({task}, timeout=5)
            left = max(0.0, stop_at - time.monotonic())
            console.print(
                f"load: {tally.requests} requests done, {len(tally.errors)} errors, "
                f"{left:.0f} s left"
            )
        await task
    return tally


async def baseline_ttfts(
    url: str, key: str, models: list[str], args: argparse.Namespace
) -> list[float]:
    """TTFT of requests sent one at a time (nothing else running)."""
    out = []
    rng = random.Random(args.seed)
    async with httpx.AsyncClient(timeout=httpx.Timeout(args.request_deadline)) as http:
        for i in range(args.baseline_requests):
            words = " ".join(rng.choice(WORDS) for _ in range(args.prompt_words))
            body = _body(models[i % len(models)], words, args.max_tokens, i)
            status, ttft, _ = await _stream(http, url, key, body, "full", 0.0)
            if status != "ok" or ttft is None:
                raise RuntimeError(f"baseline request failed: {status}")
            out.append(ttft)
    return out


def _error_kind(error: str) -> str:
    """`http_503_redis_unavailable`, `hung`, `stream_error`, ... for the RESULT breakdown."""
    head = error.split(":", 1)[0].lower()
    return re.sub(r"[^a-z0-9]+", "_", head).strip("_")[:48] or "unknown"


def replica_state(replica_url: str, secret: str) -> ReplicaState:
    """The replica's `/state` (the gateway's credentials)."""
    headers = {WIRE_VERSION_HEADER: str(WIRE_VERSION), "authorization": bearer(secret)}
    resp = httpx.get(f"{replica_url}/state", headers=headers, timeout=10)
    resp.raise_for_status()
    return ReplicaState.model_validate_json(resp.content)


def wait_idle(replica_url: str, secret: str, timeout_s: float) -> tuple[ReplicaState, float]:
    """Poll the replica until it is idle (or `timeout_s`); its last state and the wait."""
    t0 = time.monotonic()
    while True:
        state = replica_state(replica_url, secret)
        idle = (
            state.num_requests_running == 0
            and state.num_requests_waiting == 0
            and state.num_blocks == state.num_free_blocks
            and state.adapter_references == 0
        )
        waited = time.monotonic() - t0
        if idle or waited > timeout_s:
            return state, waited
        time.sleep(0.2)


def build_parser() -> argparse.ArgumentParser:
    """The `loraplex bench load` command line."""
    p = argparse.ArgumentParser(
        prog="loraplex bench load",
        description=__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--url", help="API base URL; none: a local stack")
    p.add_argument("--api-key", help="tenant API key (required with --url)")
    p.add_argument("--replica-url", help="a replica to check for idle at the end (with --url)")
    p.add_argument("--streams", type=int, default=200, help="concurrent clients")
    p.add_argument("--adapters", type=int, default=50, help="adapters the requests spread over")
    p.add_argument("--duration", type=float, default=60.0, help="seconds of load")
    p.add_argument("--max-tokens", type=int, default=32)
    p.add_argument("--prompt-words", type=int, default=24)
    p.add_argument("--slow-fraction", type=float, default=0.15, help="clients that read slowly")
    p.add_argument("--slow-delay-ms", type=float, default=100.0, help="a slow reader's pause")
    p.add_argument("--drop-fraction", type=float, default=0.15, help="clients that hang up")
    p.add_argument("--request-deadline", type=float, default=120.0, help="seconds; past: hung")
    p.add_argument("--baseline-requests", type=int, default=8)
    p.add_argument("--idle-timeout", type=float, default=30.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--keep-logs", type=Path, help="local stack: copy its logs here at the end")
    return p


def run(
    url: str, key: str, args: argparse.Namespace, replica: tuple[str, str] | None
) -> dict[str, float]:
    """Baseline, load, then the replica's state at the end; the RESULT values."""
    adapters, _base = discover(url, key, args.adapters, None)
    console.print(f"{len(adapters)} adapters, {args.streams} streams, {args.duration:.0f} s")
    base = asyncio.run(baseline_ttfts(url, key, adapters, args))
    t0 = time.perf_counter()
    tally = asyncio.run(run_load(url, key, adapters, args))
    wall = time.perf_counter() - t0
    if tally.errors:
        console.print(f"[yellow]{len(tally.errors)} errors, e.g. {tally.errors[0]}[/]")
    ttft_ms = [t * 1000 for t in tally.ttfts]
    base_p95 = pct([t * 1000 for t in base], 95)
    out = {
        "requests": float(tally.requests),
        "error_rate": len(tally.errors) / tally.requests if tally.requests else 1.0,
        "ttft_p50_ms": pct(ttft_ms, 50),
        "ttft_p95_ms": pct(ttft_ms, 95),
        "baseline_ttft_p95_ms": base_p95,
        "ttft_p95_ratio": pct(ttft_ms, 95) / base_p95 if base_p95 > 0 else float("nan"),
        "output_tps": tally.tokens / wall if wall > 0 else 0.0,
        "dropped": float(tally.dropped),
    }
    # What queueing alone explains: a closed loop of `streams` clients completing requests at
    # the measured rate spends streams / rate in the system per request (Little's law); a TTFT
    # well past it would be time lost to something other than waiting for the service rate.
    rate = tally.requests / wall if wall > 0 else 0.0
    if rate > 0:
        out["littles_law_ms"] = args.streams / rate * 1000
        out["ttft_p95_over_littles_law"] = out["ttft_p95_ms"] / out["littles_law_ms"]
    for kind, count in Counter(_error_kind(e) for e in tally.errors).items():
        out[f"errors.{kind}"] = float(count)
    if replica is not None:
        state, waited = wait_idle(*replica, args.idle_timeout)
        out["kv_blocks_in_use_end"] = float(state.num_blocks - state.num_free_blocks)
        out["adapter_references_end"] = float(state.adapter_references)
        out["requests_running_end"] = float(state.num_requests_running + state.num_requests_waiting)
        out["idle_after_s"] = waited
    return out


def print_results(results: dict[str, float]) -> None:
    """`RESULT load.<name>=<value>` lines."""
    for name, value in results.items():
        print(f"RESULT load.{name}={value:.4g}")


def main(argv: list[str]) -> int:
    """Entry point of `loraplex bench load`."""
    args = build_parser().parse_args(argv)
    if args.url:
        if not args.api_key:
            raise SystemExit("--api-key is required with --url")
        replica = None
        if args.replica_url:
            secret = os.environ.get("LORAPLEX_REPLICA_SECRET")
            if not secret:
                raise SystemExit("--replica-url needs LORAPLEX_REPLICA_SECRET")
            replica = (args.replica_url.rstrip("/"), secret)
        print_results(run(args.url.rstrip("/"), args.api_key, args, replica))
        return 0
    from loraplex.bench.serve_stack import local_stack

    with local_stack(args.adapters, args.keep_logs) as (url, key, replica_url, secret):
        print_results(run(url, key, args, (replica_url, secret)))
    return 0
