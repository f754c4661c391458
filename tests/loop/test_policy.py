"""EventLoopPolicy and install(): ferroloop's policy next to asyncio's default one."""

from __future__ import annotations

import asyncio

import pytest


def policy_class(loop_name):
    if loop_name == "asyncio":
        return asyncio.DefaultEventLoopPolicy
    import ferroloop

    return ferroloop.EventLoopPolicy


@pytest.fixture
def policy(loop_name):
    """A fresh instance of the loop's policy, installed for the test, removed afterwards."""
    instance = policy_class(loop_name)()
    asyncio.set_event_loop_policy(instance)
    try:
        yield instance
    finally:
        asyncio.set_event_loop_policy(None)


def test_policy_is_a_default_event_loop_policy(policy):
    assert isinstance(policy, asyncio.DefaultEventLoopPolicy)


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
        ferroloop.install()
        assert isinstance(asyncio.get_event_loop_policy(), ferroloop.EventLoopPolicy)
        loop = asyncio.new_event_loop()
        try:
            assert isinstance(loop, ferroloop.Loop)
        finally:
            loop.close()
    finally:
        asyncio.set_event_loop_policy(None)
