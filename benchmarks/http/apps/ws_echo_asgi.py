"""Plain ASGI 3 WebSocket echo: accepts, then sends every message back as it came.

The WebSocket benchmark (`benchmarks/http/ws.py`) keeps one binary message per connection in
flight, so each round trip is the server's frame decode, one `receive()`, one `send()` and the
frame encode and write: the cost of a chat or push server's message path. Plain HTTP requests
get a 200 `ok`, which the benchmark uses to see that the server is up.
"""


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    if scope["type"] == "http":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})
        return
    await receive()  # websocket.connect
    await send({"type": "websocket.accept"})
    while True:
        message = await receive()
        if message["type"] == "websocket.disconnect":
            return
        if message.get("bytes") is not None:
            await send({"type": "websocket.send", "bytes": message["bytes"]})
        else:
            await send({"type": "websocket.send", "text": message["text"]})
