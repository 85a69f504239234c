"""`loraplex bench node-cache`: a replica's cold load from S3 against one from the node-local
weight cache (`loader/node_cache.py`), side by side in one run.

Builds a safetensors checkpoint of random tensors in the local S3 (an embedded SeaweedFS unless
LORAPLEX_S3_ENDPOINT_URL is set) and times, alternating, best of `--passes`:

- `s3_cold_s`: a fresh streaming loader with no cache (today's every cold start);
- `fill_s`: the first cold start on a node, from S3 while keeping the copy;
- `cached_s`: a later cold start on that node, read from the kept copy after asking the
  kernel to drop it from the page cache (`posix_fadvise` DONTNEED), so it reads the disk.

The ratio `s3_over_cached` is how many times faster the second cold start loads its weights.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import tempfile
import time
from collections.abc import Callable
from dataclasses import replace

from rich.console import Console

from loraplex.bench.loader import build_checkpoint, s3_settings
from loraplex.loader.node_cache import NodeCache
from loraplex.loader.object_store import ObjectStore
from loraplex.loader.storage import StorageConfig
from loraplex.loader.stream_reader import open_loader

console = Console(stderr=True)
KEY = "bench/node-cache/model.safetensors"


def _load(storage: StorageConfig) -> int:
    """One cold load (a fresh loader, as a starting replica makes); the payload bytes."""
    got = open_loader(storage).load(KEY)
    n = sum(t.numel() * t.element_size() for t in got.values())
    del got
    gc.collect()
    return n


def _drop_page_cache(root: str) -> None:
    """Ask the kernel to forget the kept copies' pages (best effort, no root needed)."""
    for entry in NodeCache(root).entries():
        fd = os.open(entry.path, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _best(fn: Callable[[], float], passes: int) -> float:
    return min(fn() for _ in range(passes))


def main(argv: list[str]) -> int:
    """Run the node-cache benchmark; print RESULT lines."""
    parser = argparse.ArgumentParser(prog="loraplex bench node-cache", description=__doc__)
    parser.add_argument("--size-gib", type=float, default=1.0, help="checkpoint size (1)")
    parser.add_argument("--passes", type=int, default=3, help="passes per method; best counts")
    parser.add_argument("--cache-dir", default=None, help="where the copy is kept (a temp dir)")
    args = parser.parse_args(argv)

    with s3_settings() as settings:
        base = settings.storage()
        store = ObjectStore(base)
        with contextlib.suppress(Exception):
            store.client.create_bucket(Bucket=base.bucket)
        console.print(f"building a {args.size_gib:g} GiB checkpoint ...")
        blob = build_checkpoint(int(args.size_gib * 1024**3))
        store.client.put_object(Bucket=base.bucket, Key=KEY, Body=blob)
        size = len(blob)
        del blob
        gc.collect()
        root = args.cache_dir or tempfile.mkdtemp(prefix="loraplex-bench-node-cache-")
        cached = replace(base, local_cache_dir=root)

        def s3_cold() -> float:
            t0 = time.perf_counter()
            _load(base)
            return time.perf_counter() - t0

        def fill() -> float:
            shutil.rmtree(os.path.join(root, "objects"), ignore_errors=True)
            t0 = time.perf_counter()
            _load(cached)
            took = time.perf_counter() - t0
            if not NodeCache(root).entries():
                raise SystemExit("the first cold start kept no copy")
            return took

        def from_cache() -> float:
            _drop_page_cache(root)
            t0 = time.perf_counter()
            _load(cached)
            return time.perf_counter() - t0

        try:
            s3, fill_s, local = (_best(f, args.passes) for f in (s3_cold, fill, from_cache))
        finally:
            if args.cache_dir is None:
                shutil.rmtree(root, ignore_errors=True)
    gib = size / 1024**3
    print(f"RESULT node_cache.checkpoint_gib={gib:.3f}")
    print(f"RESULT node_cache.s3_cold_s={s3:.3f}")
    print(f"RESULT node_cache.fill_s={fill_s:.3f}")
    print(f"RESULT node_cache.cached_s={local:.3f}")
    print(f"RESULT node_cache.s3_gib_s={gib / s3:.3f}")
    print(f"RESULT node_cache.cached_gib_s={gib / local:.3f}")
    print(f"RESULT node_cache.fill_over_s3={fill_s / s3:.3f}")
    print(f"RESULT node_cache.s3_over_cached={s3 / local:.3f}")
    return 0
