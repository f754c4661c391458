"""Plain WSGI (PEP 3333) hello world: `GET` anything -> 200 `Hello, world!` (text/plain).

The WSGI twin of `hello_asgi.py`: no framework, so what is measured is the server's own cost per
request: parsing, building the environ, handing the call to a worker thread and the response back,
framing and writing. The 13-byte body is returned as a one-element list, with its Content-Length.
"""

BODY = b"Hello, world!"
HEADERS = [
    ("Content-Type", "text/plain; charset=utf-8"),
    ("Content-Length", str(len(BODY))),
]


def app(environ, start_response):
    start_response("200 OK", HEADERS)
    return [BODY]
