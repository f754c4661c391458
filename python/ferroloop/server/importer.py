"""Finding the app: ``"module:attr"`` import strings and ASGI 2 / ASGI 3 detection.

The error messages are uvicorn's word for word, so that a user who switches sees the same text.
"""

from __future__ import annotations

import importlib
import inspect
from collections.abc import Awaitable, Callable
from typing import Any, Literal

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


class ImportFromStringError(Exception):
    """The import string is malformed, or its module or attribute does not exist."""


def import_from_string(import_str: Any) -> Any:
    """``"pkg.module:attr.sub"`` → the object; anything that is not a string is returned as is.

    A ``ModuleNotFoundError`` raised *inside* the app's module (a missing dependency of the app)
    propagates unchanged: only the module named by the string becomes an ImportFromStringError.
    """
    if not isinstance(import_str, str):
        return import_str
    module_str, _, attrs_str = import_str.partition(":")
    if not module_str or not attrs_str:
        raise ImportFromStringError(
            f'Import string "{import_str}" must be in format "<module>:<attribute>".'
        )
    try:
        module = importlib.import_module(module_str)
    except ModuleNotFoundError as exc:
        if exc.name != module_str:
            raise
        raise ImportFromStringError(f'Could not import module "{module_str}".') from None
    instance: Any = module
    try:
        for attr in attrs_str.split("."):
            instance = getattr(instance, attr)
    except AttributeError:
        raise ImportFromStringError(
            f'Attribute "{attrs_str}" not found in module "{module_str}".'
        ) from None
    return instance


def _is_async_callable(obj: Any) -> bool:
    # inspect.iscoroutinefunction sees through functools.partial and bound methods.
    return obj is not None and inspect.iscoroutinefunction(obj)


def _has_async_call(obj: Any) -> bool:
    """Whether instances of ``type(obj)`` have a coroutine ``__call__`` method."""
    call = inspect.getattr_static(type(obj), "__call__", None)
    if isinstance(call, (staticmethod, classmethod)):
        call = call.__func__
    return _is_async_callable(call)


def detect_interface(app: Any) -> Literal["asgi3", "asgi2"]:
    """uvicorn's ``interface="auto"`` rule.

    ASGI 3 is a coroutine function ``app(scope, receive, send)`` (or an object whose ``__call__``
    is one, or a class whose instances are awaitable). Anything else is taken as ASGI 2: a
    callable ``app(scope)`` returning ``instance(receive, send)`` — typically a class.
    """
    if inspect.isclass(app):
        return "asgi3" if hasattr(app, "__await__") else "asgi2"
    if _is_async_callable(app) or _has_async_call(app):
        return "asgi3"
    return "asgi2"


def looks_like_asgi_app(app: Any) -> bool:
    """True if ``app`` is plainly an app rather than a factory: a class, a coroutine function,
    or an object with a coroutine ``__call__``. Used to avoid calling an app with no arguments
    when probing for a factory."""
    return inspect.isclass(app) or _is_async_callable(app) or _has_async_call(app)


class ASGI2Middleware:
    """Runs an ASGI 2 app as ASGI 3: ``await app(scope)(receive, send)``."""

    __slots__ = ("app",)

    def __init__(self, app: Callable[[Scope], Callable[[Receive, Send], Awaitable[None]]]) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        instance = self.app(scope)
        await instance(receive, send)
