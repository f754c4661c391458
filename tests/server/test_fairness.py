"""A small request next to a large upload on another connection (issue 27, point 3).

The server reads one bounded part of a body per readiness event, asserted as a count (the size
of each body part the app receives), not as a timing.
"""

from __future__ import annotations

import json
import uuid

import pytest

KiB = 1024
MiB = 1024 * KiB
# `READ_CHUNK` in crates/py/src/server/conn.rs: the most one read takes.
READ_CHUNK = 64 * KiB


@pytest.fixture(scope="module")
def server(serve):
    return serve("raw_asgi:app")


def upload(connect, server, size: int, mark_at: int = 0) -> dict:
    """POSTs ``size`` bytes to ``/upload-chunks`` and returns its answer (see the app)."""
    key = uuid.uuid4().hex
    body = bytes(range(256)) * (size // 256)
    response = connect(server).request(
        "POST", f"/upload-chunks?key={key}&mark_at={mark_at}", body=body
    )
    assert response.status == 200, response.body
    result = json.loads(response.body)
    assert sum(result["sizes"]) == len(body)
    return result


@pytest.mark.ferroloop_only("the size of one read is ferroloop's READ_CHUNK")
def test_body_reaches_an_app_that_keeps_up_one_read_at_a_time(server, connect):
    """An app that is always waiting in receive() gets each read as it is made: no part is
    larger than one read, so no loop iteration copies more than that for this connection
    (reading until EAGAIN once handed over up to 512 KiB at a time)."""
    result = upload(connect, server, 8 * MiB)
    assert max(result["sizes"]) <= READ_CHUNK
    assert len(result["sizes"]) >= 8 * MiB // READ_CHUNK
