"""While the database is down (e.g. being restarted by `loraplex up`'s supervisor), the API
stays up and answers a clear, retryable 503 in the OpenAI error shape, never a 500."""

from __future__ import annotations

import socket
from typing import Any

from fastapi.testclient import TestClient


def test_database_down_is_a_503_with_retry_after(settings: Any) -> None:
    from loraplex.api.app import create_app

    with socket.socket() as closed:  # bound, never listening: connections are refused
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
        down = settings.model_copy(
            update={"database_url": f"postgresql+psycopg://u:p@127.0.0.1:{port}/gone"}
        )
        with TestClient(create_app(down), raise_server_exceptions=False) as client:
            assert client.get("/healthz").status_code == 503  # up, and says its database is not
            for path in ("/v1/adapters", "/admin/v1/tenants"):
                key = down.admin_key if path.startswith("/admin") else "lp_some-key"
                resp = client.get(path, headers={"Authorization": f"Bearer {key}"})
                assert resp.status_code == 503, (path, resp.text)
                assert resp.headers["retry-after"] == "5"
                assert resp.json()["error"]["code"] == "database_unavailable"
