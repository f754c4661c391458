"""h2spec (the HTTP/2 conformance suite, RFC 7540/9113 and RFC 7541) against ferroloop, over h2c
with prior knowledge and over TLS (ALPN ``h2``), with the test apps' ``raw_asgi:app``.

What it does (needs go, to install h2spec once; the built extension in ``.venv``):

1. h2spec ``H2SPEC_VERSION`` is installed with ``go install`` into ``.venv/bin`` unless a binary
   of that version is there already (go fetches the module through the Go module proxy).
2. For each transport, a server is started (``python -m ferroloop raw_asgi:app``: ``h2c`` with
   ``--http auto``, the default, ``h2c-only`` with ``--http 2``, ``tls`` with a certificate
   ``trustme`` makes), h2spec runs against it (``-o`` seconds per case,
   ``--junit-report`` into the work directory), and the server is stopped.
3. The summary: for each transport, the cases that passed out of all; with ``--check`` the job
   fails if fewer passed than ``baseline.json`` records (``--record`` rewrites it, never
   lowering a count). The failing cases are listed by their h2spec ids.

The last line is ``h2spec: N passed, M failed``: N cases passed over all transports, M
transports fell below their baseline (which fails the job with ``--check``).

Usage, from the repository root::

    .venv/bin/python tests/external/h2spec/run.py --check    # what `make test-h2spec` runs
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
HERE = Path(__file__).resolve().parent
BASELINE = HERE / "baseline.json"
H2SPEC_MODULE = "github.com/summerwind/h2spec/cmd/h2spec"
H2SPEC_VERSION = "v2.2.1+incompatible"  # the newest the Go module proxy has (`@latest`)
STARTUP_TIMEOUT = 20.0
# Seconds h2spec waits for each answer (its default is 2; a busy 2-core machine needs more).
CASE_TIMEOUT = 10


def venv_bin() -> Path:
    return Path(sys.executable).parent


def ensure_h2spec() -> Path:
    binary = venv_bin() / "h2spec"
    stamp = venv_bin() / ".h2spec-version"
    if binary.exists() and stamp.exists() and stamp.read_text().strip() == H2SPEC_VERSION:
        return binary
    go = shutil.which("go") or "/usr/local/go/bin/go"
    if not Path(go).exists():
        raise SystemExit("h2spec: go is needed to install h2spec (go install); none on PATH")
    env = {**os.environ, "GOBIN": str(venv_bin())}
    subprocess.run([go, "install", f"{H2SPEC_MODULE}@{H2SPEC_VERSION}"], check=True, env=env)
    stamp.write_text(H2SPEC_VERSION)
    return binary


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def wait_listening(port: int, proc: subprocess.Popen[bytes]) -> None:
    deadline = time.monotonic() + STARTUP_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"h2spec: the server exited with {proc.returncode}")
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return
        except OSError:
            time.sleep(0.1)
    raise SystemExit("h2spec: the server did not start listening")


def tls_args(work: Path) -> list[str]:
    import trustme

    ca = trustme.CA()
    leaf = ca.issue_cert("127.0.0.1", "localhost")
    cert, key = work / "cert.pem", work / "key.pem"
    for index, blob in enumerate(leaf.cert_chain_pems):
        blob.write_to_path(str(cert), append=index > 0)
    leaf.private_key_pem.write_to_path(str(key))
    return ["--ssl-certfile", str(cert), "--ssl-keyfile", str(key)]


def run_one(h2spec: Path, transport: str, work: Path) -> tuple[int, int, list[str]]:
    """(passed, total, failed case ids) of h2spec against one server."""
    port = free_port()
    # h2c: --http auto (HTTP/1.1 and h2c on one port); h2c-only: --http 2; tls: auto over TLS.
    extra = tls_args(work) if transport == "tls" else []
    if transport == "h2c-only":
        extra = ["--http", "2"]
    command = [
        sys.executable, "-m", "ferroloop", "raw_asgi:app",
        "--app-dir", str(ROOT / "tests/server/apps"),
        "--host", "127.0.0.1", "--port", str(port), "--log-level", "critical", *extra,
    ]  # fmt: skip
    log = open(work / f"server-{transport}.log", "wb")  # noqa: SIM115 (closed below)
    proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=work)
    try:
        wait_listening(port, proc)
        report = work / f"h2spec-{transport}.xml"
        args = [str(h2spec), "-h", "127.0.0.1", "-p", str(port), "-o", str(CASE_TIMEOUT)]
        args += ["--junit-report", str(report)]
        if transport == "tls":
            args += ["-t", "-k"]
        out = subprocess.run(args, capture_output=True, text=True, check=False)
        (work / f"h2spec-{transport}.txt").write_text(out.stdout + out.stderr)
        if "Failures:" in out.stdout:
            # Each failed case with what h2spec expected and what it got.
            print(out.stdout[out.stdout.index("Failures:") :].rstrip())
        summary = re.search(r"(\d+) tests, (\d+) passed, (\d+) skipped, (\d+) failed", out.stdout)
        if summary is None:
            raise SystemExit(f"h2spec ({transport}): no summary line\n{out.stdout}{out.stderr}")
        total, passed = int(summary.group(1)), int(summary.group(2))
        failed = []
        if report.exists():
            for case in ET.parse(report).getroot().iter("testcase"):
                if case.find("failure") is not None or case.find("error") is not None:
                    failed.append(f"{case.get('package')} {case.get('classname')}")
        return passed, total, failed
    finally:
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        log.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="fail below baseline.json")
    parser.add_argument("--record", action="store_true", help="raise baseline.json's counts")
    parser.add_argument("--transports", default="h2c,h2c-only,tls")
    args = parser.parse_args()
    h2spec = ensure_h2spec()
    baseline = json.loads(BASELINE.read_text()) if BASELINE.exists() else {}
    regressions = 0
    passed_all = failed_all = 0
    with tempfile.TemporaryDirectory(prefix="h2spec-") as tmp:
        work = Path(tmp)
        for transport in args.transports.split(","):
            passed, total, failed = run_one(h2spec, transport, work)
            passed_all += passed
            failed_all += total - passed
            print(f"h2spec {transport}: {passed}/{total} passed")
            for case in failed:
                print(f"  failed: {case}")
            if args.check and passed < baseline.get(transport, 0):
                print(f"  below the baseline of {baseline[transport]}")
                regressions += 1
            if args.record and passed > baseline.get(transport, 0):
                baseline[transport] = passed
        if args.record:
            BASELINE.write_text(json.dumps(baseline, indent=2, sort_keys=True) + "\n")
    print(f"h2spec cases: {passed_all} passed, {failed_all} failed over all transports")
    # The closing line counts what fails the job: transports below their baseline.
    print(f"h2spec: {passed_all} passed, {regressions} failed")
    return 1 if regressions else 0


if __name__ == "__main__":
    sys.exit(main())
