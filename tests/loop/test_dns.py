"""getaddrinfo / getnameinfo agree with the socket module on local names."""

from __future__ import annotations

import asyncio
import socket

import pytest


def test_getaddrinfo_localhost_matches_socket_module(loop):
    expected = socket.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM)
    result = loop.run_until_complete(loop.getaddrinfo("localhost", 80, type=socket.SOCK_STREAM))
    assert sorted(result) == sorted(expected)


def test_getaddrinfo_numeric_host(loop):
    result = loop.run_until_complete(
        loop.getaddrinfo(
            "127.0.0.1",
            8080,
            family=socket.AF_INET,
            type=socket.SOCK_STREAM,
            flags=socket.AI_NUMERICHOST,
        )
    )
    assert result == [
        (socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP, "", ("127.0.0.1", 8080))
    ]


def test_getaddrinfo_returns_enum_members(loop):
    result = loop.run_until_complete(
        loop.getaddrinfo("127.0.0.1", 0, family=socket.AF_INET, type=socket.SOCK_DGRAM)
    )
    family, kind, *_ = result[0]
    assert family is socket.AF_INET
    assert kind is socket.SOCK_DGRAM


def test_getaddrinfo_with_string_port_and_none_host(loop):
    expected = socket.getaddrinfo(None, "80", type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    result = loop.run_until_complete(
        loop.getaddrinfo(None, "80", type=socket.SOCK_STREAM, flags=socket.AI_PASSIVE)
    )
    assert sorted(result) == sorted(expected)


def test_getaddrinfo_error_is_gaierror(loop):
    with pytest.raises(socket.gaierror):
        loop.run_until_complete(
            loop.getaddrinfo("not-a-number.invalid", 80, flags=socket.AI_NUMERICHOST)
        )


def test_getnameinfo_matches_socket_module(loop):
    flags = socket.NI_NUMERICHOST | socket.NI_NUMERICSERV
    expected = socket.getnameinfo(("127.0.0.1", 8080), flags)
    result = loop.run_until_complete(loop.getnameinfo(("127.0.0.1", 8080), flags))
    assert result == expected == ("127.0.0.1", "8080")


def test_getnameinfo_localhost_name(loop):
    expected = socket.getnameinfo(("127.0.0.1", 80), 0)
    result = loop.run_until_complete(loop.getnameinfo(("127.0.0.1", 80)))
    assert result == expected


def test_many_concurrent_getaddrinfo_calls(loop):
    async def main():
        return await asyncio.gather(
            *(
                loop.getaddrinfo("127.0.0.1", port, family=socket.AF_INET, type=socket.SOCK_STREAM)
                for port in range(1000, 1050)
            )
        )

    results = loop.run_until_complete(main())
    assert [result[0][4] for result in results] == [("127.0.0.1", p) for p in range(1000, 1050)]
