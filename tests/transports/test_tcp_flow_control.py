"""Flow control on TCP transports: pause/resume reading, write buffer limits, writelines."""

from __future__ import annotations

import asyncio
import re
import sys

import pytest

CHUNK = bytes(range(256)) * 1024  # 256 KiB

# asyncio 3.14 reworded the stream transports' refusal (the datagram transports' is unchanged).
if sys.version_info >= (3, 14):
    WRITE_TYPE_ERROR = "data argument must be a bytes, bytearray, or memoryview object, not 'str'"
else:
    WRITE_TYPE_ERROR = "data argument must be a bytes-like object, not 'str'"


def test_pause_reading_holds_data_until_resume_reading(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        accepted = ends.accepted.transport
        states = [accepted.is_reading()]
        accepted.pause_reading()
        accepted.pause_reading()  # pausing twice is a no-op
        states.append(accepted.is_reading())
        ends.client.transport.write(b"held back")
        await asyncio.sleep(0.05)
        held = bytes(ends.accepted.received)
        accepted.resume_reading()
        accepted.resume_reading()  # resuming twice is a no-op
        states.append(accepted.is_reading())
        delivered = await ends.accepted.received_at_least(9)
        await ends.close()
        states.append(accepted.is_reading())
        return states, held, delivered

    states, held, delivered = run(main())
    assert states == [True, False, True, False]
    assert held == b""
    assert delivered == b"held back"


def test_default_write_buffer_limits(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        limits = ends.client.transport.get_write_buffer_limits()
        await ends.close()
        return limits

    assert run(main()) == (16 * 1024, 64 * 1024)


@pytest.mark.parametrize(
    ("kwargs", "expected"),
    [
        ({"high": 1000, "low": 10}, (10, 1000)),
        ({"high": 1000}, (250, 1000)),
        ({"low": 100}, (100, 400)),
        ({"high": 0}, (0, 0)),
        # An int beyond 64 bits is kept as given, not turned into a float.
        ({"high": 2**70 + 3}, ((2**70 + 3) // 4, 2**70 + 3)),
    ],
)
def test_set_write_buffer_limits(loop, run, recorder, tcp_connect, kwargs, expected):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        transport = ends.client.transport
        transport.set_write_buffer_limits(**kwargs)
        limits = transport.get_write_buffer_limits()
        with pytest.raises(ValueError, match="high"):
            transport.set_write_buffer_limits(high=1, low=2)
        await ends.close()
        return limits

    assert run(main()) == expected


def test_slow_peer_pauses_then_resumes_writing(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        client = ends.client.transport
        client.set_write_buffer_limits(high=64 * 1024, low=16 * 1024)
        ends.accepted.transport.pause_reading()
        written = 0
        while "pause_writing" not in ends.client.events:
            client.write(CHUNK)
            written += len(CHUNK)
            await asyncio.sleep(0)
        buffered = client.get_write_buffer_size()
        events_while_paused = list(ends.client.events)
        ends.accepted.transport.resume_reading()
        await ends.accepted.received_at_least(written)
        drained = client.get_write_buffer_size()
        await ends.close()
        return ends, written, buffered, events_while_paused, drained

    ends, written, buffered, events_while_paused, drained = run(main())
    assert buffered > 64 * 1024
    assert events_while_paused == ["connection_made", "pause_writing"]
    assert ends.client.events == [
        "connection_made",
        "pause_writing",
        "resume_writing",
        "connection_lost",
    ]
    assert drained == 0
    assert len(ends.accepted.received) == written


def test_zero_high_water_mark_pauses_on_any_buffered_byte(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        client = ends.client.transport
        client.set_write_buffer_limits(high=0)
        ends.accepted.transport.pause_reading()
        while client.get_write_buffer_size() == 0:
            client.write(CHUNK)
            await asyncio.sleep(0)
        paused = ends.client.events.count("pause_writing")
        ends.accepted.transport.resume_reading()
        await ends.close()
        return paused, ends.client.events.count("resume_writing")

    assert run(main()) == (1, 1)


def test_writelines_sends_the_concatenation(loop, run, recorder, tcp_connect):
    pieces = [b"one ", bytearray(b"two "), memoryview(b"three"), b""]

    async def main():
        ends = await tcp_connect(recorder, recorder)
        ends.client.transport.writelines(pieces)
        ends.client.transport.writelines(iter([b" four"]))
        ends.client.transport.write_eof()
        await ends.accepted.eof
        await ends.close()
        return bytes(ends.accepted.received)

    assert run(main()) == b"one two three four"


def test_write_rejects_non_bytes(loop, run, recorder, tcp_connect):
    async def main():
        ends = await tcp_connect(recorder, recorder)
        with pytest.raises(TypeError, match=f"^{re.escape(WRITE_TYPE_ERROR)}$"):
            ends.client.transport.write("text")
        await ends.close()

    run(main())
