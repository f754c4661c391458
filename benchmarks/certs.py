"""A throwaway CA and a server certificate for 127.0.0.1, for the benchmarks that speak TLS
(benchmarks/http/tls.py, benchmarks/isolation/run.py --tls). Needs `trustme` and `cryptography`.

trustme's default key type is ECDSA P-256. The key is written as PKCS#8 (`BEGIN PRIVATE KEY`),
the only format granian's `--ssl-keyfile` is documented to take (trustme's own
`private_key_pem` is SEC1, `BEGIN EC PRIVATE KEY`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

CURVE_NAMES = {"secp256r1": "P-256", "secp384r1": "P-384", "secp521r1": "P-521"}


@dataclass(frozen=True)
class Certificates:
    ca: Path  # the CA's certificate, for the client
    cert: Path  # the server's certificate
    key: Path  # the server's private key, PKCS#8 PEM
    key_type: str  # "ECDSA P-256"


def make_certificates(directory: Path, host: str = "127.0.0.1") -> Certificates:
    """A throwaway CA and a certificate for `host` signed by it, written to `directory`."""
    import trustme
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import ec

    ca = trustme.CA()
    leaf = ca.issue_cert(host)
    ca_path, cert_path, key_path = (directory / n for n in ("ca.pem", "server.pem", "server.key"))
    ca.cert_pem.write_to_path(str(ca_path))
    cert_path.write_bytes(b"".join(pem.bytes() for pem in leaf.cert_chain_pems))
    key = serialization.load_pem_private_key(leaf.private_key_pem.bytes(), password=None)
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    if isinstance(key, ec.EllipticCurvePrivateKey):
        key_type = f"ECDSA {CURVE_NAMES.get(key.curve.name, key.curve.name)}"
    else:  # trustme's other key type
        key_type = f"RSA {key.key_size} bits"
    return Certificates(ca_path, cert_path, key_path, key_type)
