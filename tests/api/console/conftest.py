"""Console tests: the API app (with the console) over this module's control plane, and
clients that sign in through the real forms."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient


@pytest.fixture(scope="module")
def console_settings(cp_settings: Any) -> Any:
    """The module's settings with a small sign-in failure budget (the rate-limit test)."""
    return cp_settings.model_copy(update={"console_signin_failures": 4})


@pytest.fixture(scope="module")
def console_app(console_settings: Any) -> Any:
    """The API app, console included."""
    from loraplex.api.app import create_app

    return create_app(console_settings)


@pytest.fixture
def new_client(console_app: Any) -> Iterator[Callable[[], TestClient]]:
    """Make clients of the app, each with its own cookie jar. The app's lifespan (the inference
    gateway) is not started: the console does not need it, and one gateway cannot serve the
    event loops of several clients."""
    made: list[TestClient] = []

    def make() -> TestClient:
        client = TestClient(console_app, raise_server_exceptions=False)
        made.append(client)
        return client

    yield make
    for c in made:
        c.close()
