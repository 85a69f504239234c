"""A new adapter's first request against its warm ones, for `loraplex bench serve`.

Each run uploads a fresh adapter through the tenant API, sends its first request the moment
the API reports the version ready (as a client polling the status would), then a few more:
`serve.first_request_ttft_ms` over `serve.warm_ttft_ms` (medians over the runs) is what the
first caller of a new version pays extra. Every request has its own prompt of the same length,
so no prompt-prefix cache hit flatters the later ones.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import tempfile
from pathlib import Path

import httpx

from loraplex.bench._synthetic.adapters import write_random_adapter
from loraplex.bench.completion_client import WORDS, one_request
from loraplex.bench.serve_stack import TARGETS, upload_and_wait

WARM_REQUESTS = 3


def _prompt(rng: random.Random, words: int) -> str:
    return " ".join(rng.choice(WORDS) for _ in range(words))


async def _ttfts(url: str, key: str, model: str, prompts: list[str]) -> list[float]:
    async with httpx.AsyncClient(timeout=httpx.Timeout(120.0)) as http:
        # The client that polled the version's status holds an open connection: so does this
        # one, or the first request would pay the TCP connect the later ones do not.
        await http.get(f"{url}/v1/models", headers={"Authorization": f"Bearer {key}"})
        out = []
        for prompt in prompts:
            o = await one_request(http, url, key, model, prompt, 4)
            if not o.ok:
                raise RuntimeError(f"{model}: request failed: {o.error}")
            out.append(o.ttft)
        return out


def measure(
    url: str, key: str, model_dir: Path, base: str, runs: int, prompt_words: int = 48
) -> dict[str, float]:
    """Median first-request and warm TTFT (ms) over `runs` fresh adapters, and their ratio."""
    hf_config = json.loads((model_dir / "config.json").read_text())
    rng = random.Random(29)
    firsts, warms = [], []
    with tempfile.TemporaryDirectory(prefix="lpx-first-") as tmp:
        for i in range(runs):
            name = f"fresh-{i}-{rng.randrange(1 << 30):x}"
            folder = write_random_adapter(
                Path(tmp) / name, hf_config, 8, seed=1000 + i, targets=TARGETS, std=0.05
            )
            upload_and_wait(url, key, base, name, folder)
            prompts = [_prompt(rng, prompt_words) for _ in range(1 + WARM_REQUESTS)]
            ttfts = asyncio.run(_ttfts(url, key, name, prompts))
            firsts.append(ttfts[0])
            warms.append(statistics.median(ttfts[1:]))
    first, warm = statistics.median(firsts) * 1000, statistics.median(warms) * 1000
    return {
        "first_request_ttft_ms": first,
        "warm_ttft_ms": warm,
        "first_over_warm_ttft": first / warm,
    }
