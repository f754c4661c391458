"""Plain WSGI (PEP 3333) echo: reads the request body from `wsgi.input`, returns it as the response.

The WSGI twin of `echo_asgi.py`. The benchmark posts 10 KiB per request, so the server's
request-body path (buffering, `wsgi.input`, copies between the loop and the worker thread) and a
10 KiB response write are on every request.
"""


def app(environ, start_response):
    length = int(environ.get("CONTENT_LENGTH") or 0)
    body = environ["wsgi.input"].read(length) if length else b""
    start_response(
        "200 OK",
        [("Content-Type", "application/octet-stream"), ("Content-Length", str(len(body)))],
    )
    return [body]
