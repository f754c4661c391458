"""sock_sendfile: whole files, offset/count, file position, argument checks."""

from __future__ import annotations

import asyncio
import socket

import pytest

PAYLOAD = bytes(range(256)) * 1024  # 256 KiB, more than one kernel socket buffer


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "payload.bin"
    path.write_bytes(PAYLOAD)
    with path.open("rb") as file:
        yield file


def receive_exactly(loop, sock, size):
    async def reader():
        received = bytearray()
        while len(received) < size:
            chunk = await loop.sock_recv(sock, 65536)
            if not chunk:
                break
            received += chunk
        return bytes(received)

    return loop.create_task(reader())


def test_sock_sendfile_sends_the_whole_file(loop, stream_pair, data_file):
    left, right = stream_pair

    async def main():
        receive = receive_exactly(loop, right, len(PAYLOAD))
        sent = await loop.sock_sendfile(left, data_file)
        return sent, await receive

    sent, received = loop.run_until_complete(main())
    assert sent == len(PAYLOAD)
    assert received == PAYLOAD
    assert data_file.tell() == len(PAYLOAD)


def test_sock_sendfile_with_offset_and_count(loop, stream_pair, data_file):
    left, right = stream_pair

    async def main():
        receive = receive_exactly(loop, right, 1000)
        sent = await loop.sock_sendfile(left, data_file, 100, 1000)
        return sent, await receive

    sent, received = loop.run_until_complete(main())
    assert sent == 1000
    assert received == PAYLOAD[100:1100]
    assert data_file.tell() == 1100


def test_sock_sendfile_count_beyond_the_end_sends_the_rest(loop, stream_pair, data_file):
    left, right = stream_pair
    offset = len(PAYLOAD) - 10

    async def main():
        receive = receive_exactly(loop, right, 10)
        sent = await loop.sock_sendfile(left, data_file, offset, 1000)
        return sent, await receive

    sent, received = loop.run_until_complete(main())
    assert sent == 10
    assert received == PAYLOAD[-10:]


def test_sock_sendfile_of_an_empty_file(loop, stream_pair, tmp_path):
    left, _ = stream_pair
    path = tmp_path / "empty.bin"
    path.write_bytes(b"")
    with path.open("rb") as file:
        assert loop.run_until_complete(loop.sock_sendfile(left, file)) == 0


def test_sock_sendfile_rejects_datagram_sockets(loop, udp_pair, data_file):
    first, _ = udp_pair
    with pytest.raises(ValueError, match="only SOCK_STREAM type sockets are supported"):
        loop.run_until_complete(loop.sock_sendfile(first, data_file))


def test_sock_sendfile_rejects_text_files(loop, stream_pair, tmp_path):
    left, _ = stream_pair
    path = tmp_path / "text.txt"
    path.write_text("text")
    with path.open() as file, pytest.raises(ValueError, match="binary mode"):
        loop.run_until_complete(loop.sock_sendfile(left, file))


def test_sock_sendfile_rejects_negative_offset(loop, stream_pair, data_file):
    left, _ = stream_pair
    with pytest.raises(ValueError, match="offset must be a non-negative integer"):
        loop.run_until_complete(loop.sock_sendfile(left, data_file, -1))


def test_sock_sendfile_rejects_zero_count(loop, stream_pair, data_file):
    left, _ = stream_pair
    with pytest.raises(ValueError, match="count must be a positive integer"):
        loop.run_until_complete(loop.sock_sendfile(left, data_file, 0, 0))


def test_sock_sendfile_rejects_blocking_socket_in_debug_mode(loop, data_file):
    loop.set_debug(True)
    left, right = socket.socketpair()
    with left, right, pytest.raises(ValueError, match="the socket must be non-blocking"):
        loop.run_until_complete(loop.sock_sendfile(left, data_file))


def test_sock_sendfile_to_a_closed_peer_raises(loop, unix_pair, data_file):
    left, right = unix_pair
    right.close()
    with pytest.raises((BrokenPipeError, ConnectionResetError)):
        loop.run_until_complete(loop.sock_sendfile(left, data_file))


def test_sock_sendfile_without_fallback_to_a_closed_peer_raises_not_available(
    loop, unix_pair, data_file
):
    # asyncio reports a failure before the first byte as "sendfile not available", so a
    # caller with fallback=False can retry another way.
    left, right = unix_pair
    right.close()
    with pytest.raises(asyncio.SendfileNotAvailableError):
        loop.run_until_complete(loop.sock_sendfile(left, data_file, fallback=False))
    assert data_file.tell() == 0


def test_sock_sendfile_with_fallback_disabled_on_a_regular_file(loop, stream_pair, data_file):
    # Linux supports os.sendfile to any stream socket, so no fallback is needed.
    left, right = stream_pair

    async def main():
        receive = receive_exactly(loop, right, len(PAYLOAD))
        sent = await loop.sock_sendfile(left, data_file, fallback=False)
        return sent, await receive

    sent, received = loop.run_until_complete(main())
    assert sent == len(PAYLOAD)
    assert received == PAYLOAD
