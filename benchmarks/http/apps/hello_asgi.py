"""Plain ASGI 3 hello world: `GET` anything -> 200 `Hello, world!` (text/plain, Content-Length).

No framework, so the server's own per-request cost (parsing, the scope, `receive`/`send`, framing)
is nearly all that is measured. The request body is not read: a GET has none. Lifespan events
are answered so that every server starts the same way.
"""

BODY = b"Hello, world!"
START = {
    "type": "http.response.start",
    "status": 200,
    "headers": [
        (b"content-type", b"text/plain; charset=utf-8"),
        (b"content-length", str(len(BODY)).encode()),
    ],
}
RESPONSE = {"type": "http.response.body", "body": BODY}


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    await send(START)
    await send(RESPONSE)
