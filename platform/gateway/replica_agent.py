"""`python -m loraplex.platform.gateway.replica_agent`: keep one replica registered for its
deployment while its `/health` answers, so the gateway routes to it; stop beating (and let
the record expire) the moment it does not. Run it beside `loraplex engine`, or call
`register_replica` from inside the replica process.
"""

from __future__ import annotations

import argparse
import signal
import threading

from loraplex.platform.gateway.replicas import (
    DEFAULT_TTL_S,
    Heartbeat,
    ReplicaInfo,
    http_health_check,
)
from loraplex.platform.settings import Settings


def register_replica(
    redis_url: str,
    deployment: str,
    url: str,
    ttl_s: float = DEFAULT_TTL_S,
    model: str | None = None,
) -> Heartbeat:
    """Start a health-gated heartbeat for the replica at `url`; `stop()` it on shutdown."""
    info = ReplicaInfo(deployment=deployment, url=url.rstrip("/"), model=model)
    return Heartbeat(redis_url, info, ttl_s=ttl_s, healthy=http_health_check(info.url)).start()


def main(argv: list[str] | None = None) -> int:
    """Run until SIGINT/SIGTERM, then deregister."""
    p = argparse.ArgumentParser(prog="loraplex replica-agent", description=__doc__)
    p.add_argument("--replica-url", required=True, help="e.g. http://127.0.0.1:8100")
    p.add_argument("--deployment", required=True)
    p.add_argument(
        "--redis-url",
        default=None,
        help="default: the gateway's Redis from LORAPLEX_* settings (kept out of the process list)",
    )
    p.add_argument("--ttl", type=float, default=DEFAULT_TTL_S)
    args = p.parse_args(argv)
    redis_url = args.redis_url or Settings().gateway_redis_url()
    if not redis_url:
        p.error("no Redis URL: pass --redis-url or set LORAPLEX_REDIS_URL / LORAPLEX_BROKER_URL")
    hb = register_replica(redis_url, args.deployment, args.replica_url, args.ttl)
    done = threading.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: done.set())
    done.wait()
    hb.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
