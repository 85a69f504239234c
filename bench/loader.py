"""`loraplex bench loader`: the streaming loader against boto3 baselines and the raw ceiling.

Builds a >= 1 GiB safetensors checkpoint of random tensors (several dtypes) in the local S3
(an embedded SeaweedFS unless LORAPLEX_S3_ENDPOINT_URL is set), then times, side by side and
best of several passes: the streaming loader; boto3 `get_object` + `safetensors.torch.load`;
boto3 `download_file` (tuned TransferConfig) + `load_file`; the Run:ai Model Streamer when
installed; and the ceiling, parallel ranged GETs that only count bytes.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import torch
from boto3.s3.transfer import TransferConfig
from rich.console import Console
from rich.progress import Progress
from safetensors.torch import load, load_file, save

from loraplex.loader.object_store import ObjectStore
from loraplex.loader.range_plan import MIB
from loraplex.loader.stream_reader import StreamConfig, StreamLoader
from loraplex.platform.settings import Settings

console = Console(stderr=True)
KEY = "bench/loader/model.safetensors"
_DTYPES = (torch.bfloat16, torch.float16, torch.float32, torch.int64, torch.uint8)


def build_checkpoint(total_bytes: int, seed: int = 0) -> bytes:
    """Random tensors of several dtypes and sizes (1-64 MiB) adding up to `total_bytes`."""
    gen = torch.Generator().manual_seed(seed)
    tensors: dict[str, torch.Tensor] = {}
    used, i = 0, 0
    while used < total_bytes:
        dtype = _DTYPES[i % len(_DTYPES)]
        size = (1 + (i * 7919) % 64) * MIB
        size = min(size, total_bytes - used + 4096)
        elem = torch.empty((), dtype=dtype).element_size()
        cols = 1024
        rows = max(1, size // (elem * cols))
        if dtype.is_floating_point:
            t = torch.randn(rows, cols, generator=gen).to(dtype)
        else:
            t = torch.randint(0, 120, (rows, cols), generator=gen).to(dtype)
        tensors[f"model.layers.{i}.weight"] = t
        used += t.numel() * elem
        i += 1
    return save(tensors)


@contextlib.contextmanager
def s3_settings() -> Iterator[Settings]:
    """Settings for the S3 to use: the configured one, else an embedded SeaweedFS for this run."""
    settings = Settings()
    if settings.s3_endpoint_url:
        yield settings
        return
    from loraplex.platform.embedded.seaweedfs import EmbeddedSeaweedFS

    with tempfile.TemporaryDirectory(prefix="loraplex-bench-s3-") as tmp:
        weed = EmbeddedSeaweedFS(
            Path(tmp), access_key=settings.s3_access_key, secret_key=settings.s3_secret_key
        )
        console.print("starting an embedded SeaweedFS ...")
        url = weed.start()
        try:
            yield settings.model_copy(update={"s3_endpoint_url": url, "s3_bucket": "bench"})
        finally:
            weed.stop()


def _ceiling(store: ObjectStore, size: int, chunk: int, concurrency: int) -> int:
    """Parallel ranged GETs over the whole object, reading into scratch memory, counting bytes."""
    local = threading.local()

    def one(start: int) -> int:
        scratch = getattr(local, "buf", None)
        if scratch is None:
            scratch = local.buf = memoryview(bytearray(chunk))
        n = min(chunk, size - start)
        store.get_range_into(KEY, start, [scratch[:n]])
        return n

    with ThreadPoolExecutor(concurrency) as pool:
        return sum(pool.map(one, range(0, size, chunk)))


def _runai(settings: Settings, concurrency: int) -> Callable[[], int] | None:
    try:
        from runai_model_streamer import SafetensorsStreamer  # type: ignore[import-not-found]
    except ImportError:
        return None
    os.environ.update(
        {
            "AWS_ENDPOINT_URL": str(settings.s3_endpoint_url),
            "AWS_ACCESS_KEY_ID": settings.s3_access_key,
            "AWS_SECRET_ACCESS_KEY": settings.s3_secret_key,
            "AWS_DEFAULT_REGION": settings.s3_region,
            "AWS_EC2_METADATA_DISABLED": "true",
            "RUNAI_STREAMER_S3_USE_VIRTUAL_ADDRESSING": "0",
            "RUNAI_STREAMER_CONCURRENCY": str(concurrency),
        }
    )

    def run() -> int:
        n = 0
        with SafetensorsStreamer() as streamer:
            streamer.stream_file(f"s3://{settings.s3_bucket}/{KEY}")
            for _, tensor in streamer.get_tensors():
                n += tensor.numel() * tensor.element_size()
        return n

    return run


def _nbytes(tensors: dict[str, torch.Tensor]) -> int:
    return sum(t.numel() * t.element_size() for t in tensors.values())


def main(argv: list[str]) -> int:
    """Run the loader benchmark; print RESULT lines."""
    parser = argparse.ArgumentParser(prog="loraplex bench loader", description=__doc__)
    parser.add_argument("--size-gib", type=float, default=1.0, help="checkpoint size (1)")
    parser.add_argument("--passes", type=int, default=3, help="passes per method; best counts")
    parser.add_argument("--concurrency", type=int, default=8, help="concurrent ranged GETs (8)")
    parser.add_argument("--chunk-mib", type=int, default=16, help="bytes per ranged GET (16)")
    args = parser.parse_args(argv)
    total = int(args.size_gib * 1024**3)

    with s3_settings() as settings:
        store = ObjectStore(settings.storage(), max_pool_connections=max(16, 2 * args.concurrency))
        client = store.client
        with contextlib.suppress(Exception):
            client.create_bucket(Bucket=settings.s3_bucket)
        console.print(f"building a {args.size_gib:g} GiB checkpoint ...")
        blob = build_checkpoint(total)
        size = len(blob)
        client.put_object(Bucket=settings.s3_bucket, Key=KEY, Body=blob)
        reference = load(blob)
        del blob
        gc.collect()
        cfg = StreamConfig(chunk_bytes=args.chunk_mib * MIB, concurrency=args.concurrency)
        loader = StreamLoader(store, cfg)
        got = loader.load(KEY)
        bad = [k for k in reference if not torch.equal(got[k], reference[k])]
        if bad or got.keys() != reference.keys():
            console.print(f"[red]streaming loader returned wrong tensors: {bad[:3]}")
            return 1
        payload = _nbytes(reference)
        del got, reference
        gc.collect()

        tmpdir = tempfile.mkdtemp(prefix="loraplex-bench-dl-")
        transfer = TransferConfig(
            multipart_threshold=8 * MIB,
            multipart_chunksize=args.chunk_mib * MIB,
            max_concurrency=args.concurrency,
            use_threads=True,
        )

        first_tensor: list[float] = []

        def stream() -> int:
            t0 = time.perf_counter()
            out: dict[str, torch.Tensor] = {}
            for name, tensor in StreamLoader(store, cfg).iter_tensors(KEY):
                if not out:
                    first_tensor.append(time.perf_counter() - t0)
                out[name] = tensor
            return _nbytes(out)

        def boto3_get() -> int:
            body = client.get_object(Bucket=settings.s3_bucket, Key=KEY)["Body"].read()
            return _nbytes(load(body))

        def boto3_download() -> int:
            path = os.path.join(tmpdir, "model.safetensors")
            client.download_file(settings.s3_bucket, KEY, path, Config=transfer)
            try:
                return _nbytes(load_file(path))
            finally:
                os.unlink(path)

        def ceiling() -> int:
            return _ceiling(store, size, args.chunk_mib * MIB, args.concurrency)

        methods: dict[str, Callable[[], int]] = {
            "stream": stream,
            "boto3_get": boto3_get,
            "boto3_download": boto3_download,
            "ceiling": ceiling,
        }
        runai = _runai(settings, args.concurrency)
        if runai is None:
            console.print("runai-model-streamer is not installed: skipping loader.runai_gbps")
        else:
            methods["runai"] = runai
        best: dict[str, float] = {}
        with Progress(console=console) as progress:
            bar = progress.add_task("passes", total=args.passes * len(methods))
            names = list(methods)
            for p in range(args.passes):
                # Rotate the order each pass so no method always runs first (or last).
                for name in names[p % len(names) :] + names[: p % len(names)]:
                    if name not in methods:
                        continue
                    gc.collect()
                    t0 = time.perf_counter()
                    try:
                        n = methods[name]()
                    except Exception as exc:
                        if name != "runai":
                            raise
                        console.print(f"runai-model-streamer failed ({exc!r}): skipping it")
                        del methods[name]
                        continue
                    dt = time.perf_counter() - t0
                    expected = size if name == "ceiling" else payload
                    if n != expected:
                        raise RuntimeError(f"{name} read {n} bytes, expected {expected}")
                    best[name] = min(best.get(name, float("inf")), dt)
                    progress.console.print(
                        f"pass {p + 1} {name}: {dt:.3f}s {n / dt / 1e9:.3f} GB/s"
                    )
                    progress.advance(bar)
        os.rmdir(tmpdir)

    gbps = {name: (size if name == "ceiling" else payload) / s / 1e9 for name, s in best.items()}
    print(f"RESULT loader.checkpoint_bytes={size}")
    for name in methods:
        print(f"RESULT loader.{name}_seconds={best[name]:.4f}")
        print(f"RESULT loader.{name}_gbps={gbps[name]:.4f}")
    print(f"RESULT loader.stream_first_tensor_seconds={min(first_tensor):.4f}")
    best_boto3 = max(gbps["boto3_get"], gbps["boto3_download"])
    print(f"RESULT loader.over_best_boto3={gbps['stream'] / best_boto3:.3f}")
    print(f"RESULT loader.fraction_of_ceiling={gbps['stream'] / gbps['ceiling']:.3f}")
    return 0
