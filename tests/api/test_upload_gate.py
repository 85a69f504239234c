"""The per-process spool budget for multipart uploads: an upload that would take more spool
space than is left is refused (503, retry later) before its body is read, and the space comes
back when an upload ends, however it ends."""

from __future__ import annotations

import uuid

import pytest

from loraplex.api.upload_gate import UploadGate
from loraplex.platform.errors import HttpError


def test_spool_space_is_reserved_and_given_back() -> None:
    gate = UploadGate(max_spool_bytes=100)
    a, b = uuid.uuid4(), uuid.uuid4()
    with gate.receiving(a, 60):
        assert gate.in_flight(a) == 1 and gate.in_flight(b) == 0
        with pytest.raises(HttpError) as info, gate.receiving(b, 41):
            pass
        assert info.value.status == 503 and info.value.code == "upload_capacity"
        with gate.receiving(b, 40):
            assert gate.in_flight(b) == 1
    assert gate.in_flight(a) == 0
    with pytest.raises(RuntimeError), gate.receiving(a, 100):
        raise RuntimeError("the upload failed half way")
    with gate.receiving(b, 100):  # all of it is free again
        pass
