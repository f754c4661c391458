"""Plain ASGI 3 echo: reads the whole request body, then returns it as the response body.

The benchmark posts 10 KiB per request, so the server's request-body path (buffering, the
`http.request` messages and `more_body`, copies) and a 10 KiB response write are on every request.
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
    chunks = []
    more_body = True
    while more_body:
        message = await receive()
        if message["type"] == "http.disconnect":
            return
        chunks.append(message.get("body", b""))
        more_body = message.get("more_body", False)
    body = chunks[0] if len(chunks) == 1 else b"".join(chunks)
    await send(
        {
            "type": "http.response.start",
            "status": 200,
            "headers": [
                (b"content-type", b"application/octet-stream"),
                (b"content-length", str(len(body)).encode()),
            ],
        }
    )
    await send({"type": "http.response.body", "body": body})
