"""A one-file Django project (WSGI): JSON, a urlencoded form, a multipart upload, a streaming
response, a FileResponse, cookies, the client address and URLs built with reverse() (they
include SCRIPT_NAME). Run as ``python -m ferroloop django_app:application --interface wsgi``."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path

import django
from django.conf import settings

settings.configure(
    DEBUG=False,
    SECRET_KEY="ferroloop-tests-only",
    ROOT_URLCONF=__name__,
    ALLOWED_HOSTS=["*"],
    MIDDLEWARE=["django.middleware.common.CommonMiddleware"],
    INSTALLED_APPS=[],
    USE_TZ=True,
)
django.setup()

from django.core.wsgi import get_wsgi_application  # noqa: E402  (after settings)
from django.http import (  # noqa: E402
    FileResponse,
    HttpRequest,
    HttpResponse,
    JsonResponse,
    StreamingHttpResponse,
)
from django.urls import path, reverse  # noqa: E402


def echo_json(request: HttpRequest) -> HttpResponse:
    payload = json.loads(request.body)
    return JsonResponse({"method": request.method, "received": payload})


def form(request: HttpRequest) -> HttpResponse:
    return JsonResponse({"fields": request.POST.dict()})


def upload(request: HttpRequest) -> HttpResponse:
    uploaded = request.FILES["file"]
    data = uploaded.read()
    return JsonResponse(
        {
            "name": uploaded.name,
            "size": len(data),
            "sha256": hashlib.sha256(data).hexdigest(),
            "note": request.POST.get("note"),
        }
    )


def stream(request: HttpRequest) -> HttpResponse:
    count = int(request.GET["count"])

    def lines() -> Iterator[bytes]:
        for index in range(count):
            yield f"line {index} of {request.path}\n".encode()

    return StreamingHttpResponse(lines(), content_type="text/plain")


def file(request: HttpRequest) -> HttpResponse:
    return FileResponse(Path(__file__).open("rb"), content_type="text/x-python")


def cookies(request: HttpRequest) -> HttpResponse:
    response = JsonResponse(request.COOKIES)
    response.set_cookie("served", "yes")
    return response


def about(request: HttpRequest) -> HttpResponse:
    return JsonResponse(
        {
            "remote_addr": request.META["REMOTE_ADDR"],
            "scheme": request.scheme,
            "host": request.get_host(),
            "path": request.path,
            "path_info": request.path_info,
            "echo_url": reverse("echo_json"),
        }
    )


urlpatterns = [
    path("json", echo_json, name="echo_json"),
    path("form", form),
    path("upload", upload),
    path("stream", stream),
    path("file", file),
    path("cookies", cookies),
    path("about", about),
]

application = get_wsgi_application()
