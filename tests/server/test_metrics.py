"""``--metrics``: Prometheus text on a listener of its own, counted natively by each worker on
its seat of the board and read by the exporter with no message to the workers."""

from __future__ import annotations

import itertools
import json
import os
import re
import signal
import socket
import time
import urllib.error
import urllib.request
from pathlib import Path

import pytest

pytestmark = pytest.mark.ferroloop_only("--metrics is ferroloop's")

SAMPLE = re.compile(r"^([a-z_]+)(?:\{([^}]*)\})? (\S+)$")


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def scrape(port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The samples of http://127.0.0.1:PORT/metrics, by (name, labels)."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        assert response.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = response.read().decode()
    samples = {}
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        match = SAMPLE.match(line)
        assert match, f"not an exposition line: {line!r}"
        name, labels, value = match.groups()
        pairs = tuple((k, v) for k, v in re.findall(r'([a-z_]+)="([^"]*)"', labels or ""))
        samples[(name, pairs)] = float(value)
    return samples


def requests_total(samples, method: str, status: str) -> float:
    return samples.get(("ferroloop_requests_total", (("method", method), ("status", status))), 0.0)


def send_mix(connect, server) -> None:
    """3 GET 200, 2 GET 404, 1 POST 200, 1 GET 500 (the app raises)."""
    connection = connect(server)
    for _ in range(3):
        assert connection.request("GET", "/hello").status == 200
    for _ in range(2):
        assert connection.request("GET", "/missing").status == 404
    assert connection.request("POST", "/echo", body=b"x" * 10).status == 200
    assert connection.request("GET", "/raise-before-start").status == 500


@pytest.mark.parametrize(
    "workers",
    [
        pytest.param(
            (),
            id="one",
            marks=pytest.mark.single_process(reason="checks the one-process exporter's one seat"),
        ),
        pytest.param(("--workers", "2"), id="workers-2"),
    ],
)
def test_counts_agree_with_the_requests_sent(spawn_server, connect, workers):
    port = free_port()
    server = spawn_server("raw_asgi:app", "--metrics", "--metrics-port", str(port), *workers)
    server.wait_for_output("Serving metrics on")
    send_mix(connect, server)
    deadline = time.monotonic() + 10
    while True:
        samples = scrape(port)
        if requests_total(samples, "GET", "5xx") >= 1 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    assert requests_total(samples, "GET", "2xx") == 3
    assert requests_total(samples, "GET", "4xx") == 2
    assert requests_total(samples, "POST", "2xx") == 1
    assert requests_total(samples, "GET", "5xx") == 1
    count = samples[("ferroloop_request_duration_seconds_count", ())]
    assert count == 7
    assert samples[("ferroloop_request_duration_seconds_bucket", (("le", "+Inf"),))] == 7
    buckets = sorted(
        (float(labels[0][1]), value)
        for (name, labels), value in samples.items()
        if name == "ferroloop_request_duration_seconds_bucket" and labels[0][1] != "+Inf"
    )
    assert all(a[1] <= b[1] for a, b in itertools.pairwise(buckets)), "buckets are cumulative"
    assert 0 < samples[("ferroloop_request_duration_seconds_sum", ())] < 10
    assert samples[("ferroloop_requests_in_flight", ())] == 0
    started = [v for (n, _), v in samples.items() if n == "ferroloop_worker_tasks_started_total"]
    assert sum(started) == 7
    front = [n for (n, _) in samples if n.startswith("ferroloop_front_")]
    if workers:
        assert samples[("ferroloop_front_dispatched_total", ())] >= 1
        # Each worker takes its seat once its app is loaded: all three in time.
        deadline = time.monotonic() + 10
        while len(started) < 3:
            assert time.monotonic() < deadline, "two general workers and the fast one"
            time.sleep(0.05)
            started = [
                v
                for (n, _), v in scrape(port).items()
                if n == "ferroloop_worker_tasks_started_total"
            ]
        assert len(started) == 3
    else:
        assert front == [] and len(started) == 1
    try:
        urllib.request.urlopen(f"http://127.0.0.1:{port}/other", timeout=10)
        raise AssertionError("only /metrics is served")
    except urllib.error.HTTPError as exc:
        with exc:  # its body; 3.14 warns (ResourceWarning) about one left open
            assert exc.code == 404


def test_a_request_in_flight_shows_and_so_does_its_worker_s_busy_time(
    spawn_server, connect, tmp_path
):
    port = free_port()
    server = spawn_server("raw_asgi:app", "--metrics", "--metrics-port", str(port))
    server.wait_for_output("Serving metrics on")
    connection = connect(server)
    connection.send(b"GET /sleep?s=1 HTTP/1.1\r\nHost: t\r\n\r\n")
    deadline = time.monotonic() + 10
    while scrape(port)[("ferroloop_requests_in_flight", ())] != 1:
        assert time.monotonic() < deadline, "the sleeping request never showed"
        time.sleep(0.02)
    time.sleep(0.2)
    busy = [v for (n, _), v in scrape(port).items() if n == "ferroloop_worker_busy_seconds"]
    assert sorted(busy)[-1] >= 0.2 and sorted(busy)[:-1] == [0.0] * (len(busy) - 1)
    assert connection.read_response().status == 200


def test_the_exposition_parses_with_prometheus_client(spawn_server, connect):
    parser = pytest.importorskip("prometheus_client.parser")
    port = free_port()
    server = spawn_server(
        "raw_asgi:app", "--metrics", "--metrics-port", str(port), "--workers", "2"
    )
    server.wait_for_output("Serving metrics on")
    send_mix(connect, server)
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as response:
        families = {
            f.name: f for f in parser.text_string_to_metric_families(response.read().decode())
        }
    assert families["ferroloop_request_duration_seconds"].type == "histogram"
    assert families["ferroloop_requests"].type == "counter"


def test_a_taken_metrics_port_stops_the_server_with_a_clear_error(spawn_server):
    with socket.create_server(("127.0.0.1", 0)) as taken:
        port = taken.getsockname()[1]
        for workers in ((), ("--workers", "2")):
            server = spawn_server(
                "raw_asgi:app", "--metrics", "--metrics-port", str(port), *workers, wait=False
            )
            assert server.wait_exit() == 1
            assert f"cannot serve metrics on 127.0.0.1:{port}" in server.output_text()


def test_totals_keep_the_requests_of_replaced_workers(spawn_server, connect):
    """Workers replaced at their request limit: their counts stay in the totals."""
    port = free_port()
    server = spawn_server(
        "raw_asgi:app",
        *("--metrics", "--metrics-port", str(port)),
        *("--workers", "2", "--limit-max-requests", "3"),
    )
    server.wait_for_output("Serving metrics on")
    for _ in range(20):
        connection = connect(server)
        assert connection.request("GET", "/hello").status == 200
        connection.close()
    server.wait_for_output("exited after its request limit")
    deadline = time.monotonic() + 10
    while requests_total(scrape(port), "GET", "2xx") != 20:
        assert time.monotonic() < deadline, scrape(port)
        time.sleep(0.05)
    samples = scrape(port)
    assert restarts(samples, "max_requests") >= 1
    assert restarts(samples, "crash") == restarts(samples, "healthcheck") == 0


def restarts(samples, reason: str) -> float:
    return samples[("ferroloop_worker_restarts_total", (("reason", reason),))]


def resident(samples) -> dict[int, float]:
    return {
        int(labels[0][1]): value
        for (name, labels), value in samples.items()
        if name == "ferroloop_worker_resident_memory_bytes"
    }


def test_restarts_are_counted_by_reason_and_each_worker_s_memory_shows(spawn_server, connect):
    """A killed worker counts as a crash, SIGHUP's new workers as `signal`; every worker's
    RSS is there, and a replaced worker's is not."""
    port = free_port()
    server = spawn_server(
        "raw_asgi:app", "--metrics", "--metrics-port", str(port), "--workers", "2"
    )
    server.wait_for_output("Serving metrics on")
    assert connect(server).request("GET", "/hello").status == 200
    deadline = time.monotonic() + 10
    while len(resident(samples := scrape(port))) < 3:  # two general workers and the fast one
        assert time.monotonic() < deadline, samples
        time.sleep(0.05)
    memory = resident(samples)
    assert all(20_000_000 < rss < 2_000_000_000 for rss in memory.values()), memory
    assert [restarts(samples, r) for r in ("crash", "max_requests", "healthcheck", "signal")] == [
        0,
        0,
        0,
        0,
    ]
    # Every metric the example dashboard queries is one the server exports.
    dashboard = (Path(__file__).parents[2] / "docs" / "grafana-dashboard.json").read_text()
    queried = set(re.findall(r"ferroloop_[a-z_]+", "".join(
        t["expr"] for p in json.loads(dashboard)["panels"] for t in p["targets"]
    )))  # fmt: skip
    assert queried and queried <= {name for name, _ in samples}, queried
    # The workers' loops publish their counters once a second (each publication a timer).
    deadline = time.monotonic() + 10
    while (samples := scrape(port)).get(("ferroloop_loop_lag_seconds_count", ()), 0) < 3:
        assert time.monotonic() < deadline, samples
        time.sleep(0.1)
    assert samples[("ferroloop_loop_iterations_total", ())] > 0
    busy = [
        value
        for (name, labels), value in samples.items()
        if name == "ferroloop_loop_iteration_seconds_bucket"
    ]
    assert (
        busy == sorted(busy) and busy[-1] == samples[("ferroloop_loop_iteration_seconds_count", ())]
    )
    victim = min(memory)
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while restarts(samples := scrape(port), "crash") != 1 or len(resident(samples)) < 3:
        assert time.monotonic() < deadline, samples
        time.sleep(0.05)
    assert victim not in resident(samples)
    server.proc.send_signal(signal.SIGHUP)
    deadline = time.monotonic() + 20
    while restarts(samples := scrape(port), "signal") != 3:
        assert time.monotonic() < deadline, samples
        time.sleep(0.05)
    assert restarts(samples, "crash") == 1


def test_a_dead_metrics_process_is_replaced(spawn_server):
    port = free_port()
    server = spawn_server(
        "raw_asgi:app", "--metrics", "--metrics-port", str(port), "--workers", "2"
    )
    found = re.search(r"/metrics \(process \[(\d+)\]\)", server.wait_for_output("(process ["))
    assert found
    scrape(port)
    os.kill(int(found.group(1)), signal.SIGKILL)
    server.wait_for_output("The metrics process")
    deadline = time.monotonic() + 10
    while True:
        try:
            scrape(port)
            break
        except OSError:
            assert time.monotonic() < deadline, "metrics were not served again"
            time.sleep(0.05)


def test_sigterm_still_refuses_new_connections_with_metrics_on(spawn_server, connect):
    """The metrics process holds no copy of the listening socket: once the front has closed
    it, new connections are refused."""
    port = free_port()
    server = spawn_server(
        "raw_asgi:app", "--metrics", "--metrics-port", str(port), "--workers", "2"
    )
    server.wait_for_output("(process [")
    # A request in flight keeps the server draining for 3 s.
    slow = connect(server)
    slow.send(b"GET /sleep?s=3 HTTP/1.1\r\nHost: t\r\n\r\n")
    time.sleep(0.3)
    server.proc.send_signal(signal.SIGTERM)
    deadline = time.monotonic() + 1.5
    while (sock := server.try_connect()) is not None:
        sock.close()
        assert time.monotonic() < deadline, "still accepting after SIGTERM"
        time.sleep(0.05)
    assert slow.read_response().status == 200
    server.assert_exits_cleanly()
