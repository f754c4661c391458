"""A small request next to a large upload on another connection (issue 27, point 3).

The server reads one bounded part of a body per readiness event, and starts the app of a
request in the loop iteration that read it. Both are asserted as counts and order (the size of
each body part the app receives; how many parts an upload received between a small request
being sent and its app running), not as timings.
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


@pytest.mark.ferroloop_only(
    "ferroloop starts an app in the loop iteration that read its request (as uvloop runs "
    "what I/O callbacks scheduled in the same iteration); asyncio's loop starts it in the next"
)
@pytest.mark.single_process(
    reason="it checks one loop's order: the small request and the upload must share a worker"
)
@pytest.mark.cpython_loan("task_layout")
def test_small_request_starts_in_the_iteration_that_read_it(server, connect):
    """The small request is sent right after the upload's fourth part reached its app. The next
    poll sees it together with the upload's next read; its app runs at the end of that
    iteration, when the upload has received at most one more part. Started in the iteration
    after, it ran once the upload had received two more."""
    mark_at = 4
    result = upload(connect, server, 8 * MiB, mark_at=mark_at)
    assert len(result["sizes"]) > mark_at + 2, "the upload ended before the small request ran"
    assert result["mark"] is not None
    assert mark_at <= result["mark"] <= mark_at + 1
