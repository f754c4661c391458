"""HTTPS server benchmarks: ferroloop against granian, uvicorn and hypercorn over TLS, in one run.

    python benchmarks/http/tls.py [--servers granian,uvicorn,hypercorn,ferroloop]
        [--scenarios hello,fastapi,echo10k] [--connections 64,256] [--duration 8] [--repeats 3]
        [--out DIR]

`run.py`'s benchmark (its apps, scenarios, checks, cell procedure and report) with TLS switched
on in every server and nothing else changed; results in benchmarks/results/tls.{md,json,png}.
What it adds to the plain numbers is what TLS costs each server on kept-alive connections:
decrypting every request and encrypting every response. Handshakes happen once per connection
at the start of each wrk run (64 or 256 of them, well under 1% of the requests measured).

At start, `trustme` makes a throwaway CA and a server certificate for 127.0.0.1 (an IP address
SAN), both with its default key type, ECDSA P-256, in a temporary directory removed at the end.
The server key is written as PKCS#8 (`BEGIN PRIVATE KEY`), the only format granian's
`--ssl-keyfile` is documented to take (trustme's own `private_key_pem` is SEC1, `BEGIN EC
PRIVATE KEY`); every server gets the same two files, its options appended to `servers.py`'s
command line:

- ferroloop: `--ssl-certfile CERT --ssl-keyfile KEY`
- granian: `--ssl-certificate CERT --ssl-keyfile KEY` (`--ssl-protocol-min` left at its
  default, tls1.3)
- uvicorn: `--ssl-certfile CERT --ssl-keyfile KEY`
- hypercorn: `--certfile CERT --keyfile KEY`

The readiness probe and the correctness checks go over HTTPS with Python's default client
context trusting the CA (it verifies the certificate for 127.0.0.1 and offers TLS 1.2 and 1.3);
the TLS version and cipher their handshakes settled on are recorded per server in the report's
header. wrk measures `https://127.0.0.1:PORT/...` (OpenSSL; it does not verify certificates).
"""

from __future__ import annotations

import importlib.metadata
import ssl
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

import run
import scenarios
import servers
from certs import Certificates, make_certificates


@dataclass(frozen=True)
class TlsServer(servers.Server):
    """A server started as `run.py` starts it, plus its options for a certificate and key."""

    certfile: str
    keyfile: str

    def command(self, app: str, port: int | str) -> list[str]:
        cert, key = self.certfile, self.keyfile
        tls = {
            "ferroloop": ["--ssl-certfile", cert, "--ssl-keyfile", key],
            "granian": ["--ssl-certificate", cert, "--ssl-keyfile", key],
            "uvicorn": ["--ssl-certfile", cert, "--ssl-keyfile", key],
            "hypercorn": ["--certfile", cert, "--keyfile", key],
        }
        if self.name not in tls:
            raise ValueError(f"unknown server {self.name!r}")
        return [*super().command(app, port), *tls[self.name]]


def tls_suite(certs: Certificates) -> run.Suite:
    client = ssl.create_default_context(cafile=str(certs.ca))
    note = (
        f"TLS: every server has the same certificate for {servers.HOST} and key, {certs.key_type} "
        f"(PKCS#8), from a throwaway CA made with trustme "
        f"{importlib.metadata.version('trustme')}; the checks verify it with Python's default "
        f"client context ({ssl.OPENSSL_VERSION}, TLS 1.2 and 1.3 offered); wrk does not verify it"
    )
    return run.Suite(
        script="benchmarks/http/tls.py",
        description=__doc__.split("\n")[0],
        servers={
            server.name: TlsServer(
                server.name, server.module, server.requires, str(certs.cert), str(certs.key)
            )
            for server in servers.SERVERS
        },
        scenarios=scenarios.BY_NAME,
        stem="tls",
        what="HTTPS server",
        ssl_context=client,
        notes=(note,),
    )


def main(argv: list[str]) -> int:
    try:
        import trustme  # noqa: F401
    except ImportError:
        sys.exit("trustme is not installed (.venv/bin/pip install trustme)")
    with tempfile.TemporaryDirectory(prefix="ferroloop-tls-bench-certs-") as tmp:
        return run.main(argv, tls_suite(make_certificates(Path(tmp))))


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
