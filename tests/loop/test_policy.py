"""EventLoopPolicy and install(): ferroloop's policy next to asyncio's default one."""

from __future__ import annotations

import asyncio
import sys

import pytest

# Policies are deprecated from 3.14 (removed in 3.16): asyncio's public names warn there, so the
# tests reach the same objects through the names asyncio itself uses.
if sys.version_info >= (3, 14):
    from asyncio.events import _get_event_loop_policy as get_policy
    from asyncio.events import _set_event_loop_policy as set_policy
    from asyncio.unix_events import _DefaultEventLoopPolicy as DefaultPolicy
else:
    from asyncio import DefaultEventLoopPolicy as DefaultPolicy
    from asyncio import get_event_loop_policy as get_policy
    from asyncio import set_event_loop_policy as set_policy


def policy_class(loop_name):
    if loop_name == "asyncio":
        return DefaultPolicy
    import ferroloop

    return ferroloop.EventLoopPolicy


@pytest.fixture
def policy(loop_name):
    """A fresh instance of the loop's policy, installed for the test, removed afterwards."""
    instance = policy_class(loop_name)()
    set_policy(instance)
    try:
        yield instance
    finally:
        set_policy(None)


def test_policy_is_a_default_event_loop_policy(policy):
    assert isinstance(policy, DefaultPolicy)


def test_policy_new_event_loop_makes_the_right_loop(policy, loop_factory):
    reference = loop_factory()
    made = policy.new_event_loop()
    try:
        assert type(made) is type(reference)
    finally:
        made.close()
        reference.close()


def test_asyncio_new_event_loop_follows_the_policy(policy, loop_factory):
    reference = loop_factory()
    made = asyncio.new_event_loop()
    try:
        assert type(made) is type(reference)
    finally:
        made.close()
        reference.close()


def test_asyncio_run_follows_the_policy(policy, loop_factory):
    reference = loop_factory()
    reference.close()

    async def main():
        return type(asyncio.get_running_loop())

    assert asyncio.run(main()) is type(reference)


def test_install_sets_ferroloop_policy():
    import ferroloop

    try:
        ferroloop.install()  # no deprecation warning of asyncio's (filterwarnings = error)
        assert isinstance(get_policy(), ferroloop.EventLoopPolicy)
        loop = asyncio.new_event_loop()
        try:
            assert isinstance(loop, ferroloop.Loop)
        finally:
            loop.close()
    finally:
        set_policy(None)
