"""Embedded services for a laptop or a test run: PostgreSQL, SeaweedFS S3 and Redis.

Shared by `loraplex up` and the test fixtures; each starts under a data dir on loopback
and reuses what an earlier start left there.
"""

from loraplex.platform.embedded.postgres import EmbeddedPostgres
from loraplex.platform.embedded.process import EmbeddedServiceError
from loraplex.platform.embedded.redis import EmbeddedRedis
from loraplex.platform.embedded.seaweedfs import EmbeddedSeaweedFS

__all__ = ["EmbeddedPostgres", "EmbeddedRedis", "EmbeddedSeaweedFS", "EmbeddedServiceError"]
