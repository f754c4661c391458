"""loop.sendfile over transports: zero-copy on plain TCP, and the read-and-write fallback."""

from __future__ import annotations

import asyncio
import io

import pytest

PAYLOAD = bytes(range(256)) * 2048  # 512 KiB, several kernel socket buffers


@pytest.fixture
def data_file(tmp_path):
    path = tmp_path / "payload.bin"
    path.write_bytes(PAYLOAD)
    with path.open("rb") as file:
        yield file


def test_sendfile_without_fallback_uses_the_zero_copy_path(
    loop, run, recorder, tcp_connect, data_file
):
    # fallback=False either takes the native os.sendfile path or raises: success proves the former.
    async def main():
        ends = await tcp_connect(recorder, recorder)
        sent = await loop.sendfile(ends.client.transport, data_file, fallback=False)
        received = await ends.accepted.received_at_least(len(PAYLOAD))
        reading = ends.client.transport.is_reading()
        await ends.close()
        return sent, received, reading

    sent, received, reading = run(main())
    assert sent == len(PAYLOAD)
    assert received == PAYLOAD
    assert data_file.tell() == len(PAYLOAD)
    assert reading  # sendfile pauses reading while it runs and resumes it afterwards


def test_sendfile_with_offset_and_count(loop, run, recorder, tcp_connect, data_file):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        sent = await loop.sendfile(ends.client.transport, data_file, 1000, 70000)
        received = await ends.accepted.received_at_least(70000)
        await ends.close()
        return sent, received

    assert run(main()) == (70000, PAYLOAD[1000:71000])
    assert data_file.tell() == 71000


def test_sendfile_keeps_order_with_buffered_writes(loop, run, recorder, tcp_connect, data_file):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        ends.accepted.transport.pause_reading()
        transport.write(b"header" * 100000)  # buffered: the peer does not read yet
        sending = loop.create_task(loop.sendfile(transport, data_file, 0, 1000))
        await asyncio.sleep(0.01)
        ends.accepted.transport.resume_reading()
        sent = await sending
        transport.write(b"trailer")
        total = 600000 + 1000 + 7
        received = await ends.accepted.received_at_least(total)
        await ends.close()
        return sent, received

    sent, received = run(main())
    assert sent == 1000
    assert received == b"header" * 100000 + PAYLOAD[:1000] + b"trailer"


def test_sendfile_falls_back_for_a_file_without_a_descriptor(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        file = io.BytesIO(PAYLOAD)
        with pytest.raises(asyncio.SendfileNotAvailableError):
            await loop.sendfile(ends.client.transport, file, fallback=False)
        sent = await loop.sendfile(ends.client.transport, file)
        received = await ends.accepted.received_at_least(len(PAYLOAD))
        await ends.close()
        return sent, received, file.tell()

    assert run(main()) == (len(PAYLOAD), PAYLOAD, len(PAYLOAD))


def test_sendfile_over_tls_uses_the_fallback(
    loop, run, recorder, tcp_connect, data_file, server_ssl, client_ssl
):
    async def main():
        ends = await tcp_connect(
            recorder, recorder, ssl=client_ssl, server_hostname="localhost", server_ssl=server_ssl
        )
        with pytest.raises(RuntimeError, match="fallback is disabled"):
            await loop.sendfile(ends.client.transport, data_file, fallback=False)
        sent = await loop.sendfile(ends.client.transport, data_file)
        received = await ends.accepted.received_at_least(len(PAYLOAD))
        await ends.close()
        return sent, received

    assert run(main()) == (len(PAYLOAD), PAYLOAD)
    assert data_file.tell() == len(PAYLOAD)


def test_sendfile_on_a_closing_transport_raises(loop, run, recorder, tcp_connect, data_file):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        ends.client.transport.close()
        with pytest.raises(RuntimeError, match="Transport is closing"):
            await loop.sendfile(ends.client.transport, data_file)
        await ends.close()

    run(main())
    assert data_file.tell() == 0


def test_sendfile_over_a_datagram_transport_is_unsupported(loop, run, data_file):
    async def main():
        transport, _ = await loop.create_datagram_endpoint(
            asyncio.DatagramProtocol, local_addr=("127.0.0.1", 0)
        )
        try:
            with pytest.raises(RuntimeError, match="sendfile is not supported"):
                await loop.sendfile(transport, data_file)
        finally:
            transport.close()
            await asyncio.sleep(0)

    run(main())


def test_sendfile_rejects_a_text_file(loop, run, recorder, tcp_connect, tmp_path):
    path = tmp_path / "text.txt"
    path.write_text("text")

    async def main():
        ends = await tcp_connect(recorder, recorder)
        with path.open() as text_file, pytest.raises(ValueError, match="binary mode"):
            await loop.sendfile(ends.client.transport, text_file)
        await ends.close()

    run(main())


@pytest.mark.parametrize(
    ("offset", "count", "message"),
    [(-1, None, "offset must be a non-negative integer"), (0, 0, "count must be a positive")],
)
def test_sendfile_argument_errors_leave_the_transport_usable(
    loop, run, recorder, tcp_connect, data_file, offset, count, message
):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        with pytest.raises(ValueError, match=message):
            await loop.sendfile(ends.client.transport, data_file, offset, count)
        reading = ends.client.transport.is_reading()
        ends.accepted.transport.write(b"still reading")
        received = await ends.client.received_at_least(13)
        await ends.close()
        return reading, received

    assert run(main()) == (True, b"still reading")
