"""Real frameworks through httpx: FastAPI and Starlette, each with JSON bodies, streaming,
lifespan state (and, for FastAPI, path parameters and background tasks)."""

from __future__ import annotations

import httpx
import pytest


@pytest.fixture(scope="module")
def marker_dir(tmp_path_factory):
    return tmp_path_factory.mktemp("markers")


@pytest.fixture(scope="module")
def fastapi_client(serve, marker_dir):
    server = serve("fastapi_app:app", env={"FERROLOOP_TEST_MARKER_DIR": str(marker_dir)})
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


@pytest.fixture(scope="module")
def starlette_client(serve):
    server = serve("starlette_app:app")
    with httpx.Client(base_url=server.url, timeout=10) as client:
        yield client


def test_fastapi_json_body_is_validated_and_echoed(fastapi_client):
    item = {"name": "widget", "price": 2.5, "tags": ["a", "b"]}
    response = fastapi_client.post("/items", json=item)
    assert response.status_code == 200
    assert response.json() == {"item": item, "total": 5.0}


def test_fastapi_invalid_json_body_gets_422(fastapi_client):
    response = fastapi_client.post("/items", json={"name": "widget", "price": "not a number"})
    assert response.status_code == 422
    assert response.json()["detail"][0]["loc"] == ["body", "price"]


def test_fastapi_path_and_query_parameters(fastapi_client):
    assert fastapi_client.get("/items/42", params={"q": "a b"}).json() == {
        "item_id": 42,
        "q": "a b",
    }
    assert fastapi_client.get("/items/not-an-int").status_code == 422


def test_fastapi_streaming_response(fastapi_client):
    with fastapi_client.stream("GET", "/stream", params={"count": 50}) as response:
        assert response.headers["transfer-encoding"] == "chunked"
        body = b"".join(response.iter_bytes())
    assert body == b"".join(b"line %d\n" % index for index in range(50))


def test_fastapi_background_task_runs_after_the_response(fastapi_client, marker_dir, wait_until):
    response = fastapi_client.post("/background/first-task")
    assert response.json() == {"scheduled": "first-task"}
    wait_until((marker_dir / "first-task").exists, "the background task's marker file")


def test_fastapi_lifespan_state_reaches_request_state(fastapi_client):
    assert fastapi_client.get("/state").json() == {"greeting": "hello from the fastapi lifespan"}


def test_fastapi_unknown_route_is_404(fastapi_client):
    assert fastapi_client.get("/nowhere").status_code == 404


def test_starlette_json_echo(starlette_client):
    payload = {"b": [1, 2, 3], "a": {"nested": True}, "text": "caf\u00e9"}
    response = starlette_client.post("/echo", json=payload)
    assert response.json() == {"received": payload, "keys": ["a", "b", "text"]}


def test_starlette_streaming_response(starlette_client):
    with starlette_client.stream("GET", "/stream", params={"count": 20}) as response:
        body = b"".join(response.iter_bytes())
    assert body == b"".join(b"part %d;" % index for index in range(20))


def test_starlette_lifespan_state(starlette_client):
    assert starlette_client.get("/state").json() == {
        "greeting": "hello from the starlette lifespan"
    }


def test_starlette_many_requests_on_one_keep_alive_connection(starlette_client):
    for index in range(50):
        response = starlette_client.post("/echo", json={"index": index})
        assert response.json()["received"] == {"index": index}
