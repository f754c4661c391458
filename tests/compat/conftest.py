"""Fixtures for the compatibility tests: real asyncio libraries, unchanged, on both loops.

The ``loop``/``run`` fixtures of tests/conftest.py do the rest: each test runs once on asyncio's
loop and once on ferroloop, every await is bounded by ``run``'s timeout, and a call of the
loop's exception handler that the test did not expect fails it.

TLS material is made at test time with ``trustme``: one throwaway CA per session and a
certificate for ``localhost`` and ``127.0.0.1`` signed by it.
"""

from __future__ import annotations

import ssl

import pytest
import trustme


@pytest.fixture(scope="session")
def certificate_authority() -> trustme.CA:
    return trustme.CA()


@pytest.fixture
def tls_server(certificate_authority: trustme.CA) -> ssl.SSLContext:
    """A server context presenting a certificate for localhost and 127.0.0.1."""
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    certificate_authority.issue_cert("localhost", "127.0.0.1").configure_cert(context)
    return context


@pytest.fixture
def tls_client(certificate_authority: trustme.CA) -> ssl.SSLContext:
    """A client context that trusts the session's CA (and checks the host name)."""
    context = ssl.create_default_context()
    certificate_authority.configure_trust(context)
    return context
