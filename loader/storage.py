"""The loader's own storage configuration: where objects live and how hard to pull on them.

The loader never reads the platform's `Settings`: whoever starts it (the engine server, a
benchmark, a test) builds a `StorageConfig` at the edge (`Settings.storage()` does it for the
platform) and hands it in. Torch-free, so the control plane may build one too.
"""

from __future__ import annotations

import dataclasses
import random
from dataclasses import dataclass, field

DEFAULT_CONCURRENCY = 8
"""Concurrent ranged GETs per load (also the platform's `loader_concurrency` default)."""

DEFAULT_CHUNK_BYTES = 16 * 1024 * 1024
"""Bytes per ranged GET (also the platform's `loader_chunk_bytes` default)."""


@dataclass(frozen=True)
class RetryPolicy:
    """How transient failures are retried: attempts in total and the backoff between them."""

    max_attempts: int = 6
    base_delay_s: float = 0.05
    max_delay_s: float = 2.0

    def delay(self, attempt: int) -> float:
        """Full-jitter exponential backoff before retry number `attempt` (1-based)."""
        return random.uniform(0, min(self.max_delay_s, self.base_delay_s * 2 ** (attempt - 1)))


@dataclass(frozen=True)
class StorageConfig:
    """One S3-compatible bucket and the loader's knobs for reading it."""

    endpoint_url: str | None = None
    bucket: str = ""
    access_key: str | None = None
    secret_key: str | None = field(default=None, repr=False)
    region: str = "us-east-1"
    concurrency: int = DEFAULT_CONCURRENCY
    chunk_bytes: int = DEFAULT_CHUNK_BYTES
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    local_cache_dir: str | None = None
    """A node-local directory that keeps whole weight files read once (`node_cache.py`)."""
    local_cache_max_bytes: int | None = None
    """The node cache's size limit; the least recently used files go first (None: no limit)."""

    def __post_init__(self) -> None:
        if self.concurrency < 1 or self.chunk_bytes < 1:
            raise ValueError(
                f"concurrency and chunk_bytes must be >= 1, got {self.concurrency}, "
                f"{self.chunk_bytes}"
            )
        if self.local_cache_max_bytes is not None and self.local_cache_max_bytes < 1:
            raise ValueError(
                f"local_cache_max_bytes must be >= 1, got {self.local_cache_max_bytes}"
            )

    def credentials(self) -> dict[str, str]:
        """boto3 client keyword arguments: the static key pair, or none (the default chain, IRSA)."""
        if self.access_key is None or self.secret_key is None:
            return {}
        return {"aws_access_key_id": self.access_key, "aws_secret_access_key": self.secret_key}

    def with_bucket(self, bucket: str) -> StorageConfig:
        """The same store, another bucket (an `s3://BUCKET/...` model location names its own)."""
        return dataclasses.replace(self, bucket=bucket)
