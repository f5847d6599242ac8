"""omp.groups: what a nursery's exception group stands for at a boundary that faces a caller."""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest
import trio

from omp.groups import chain, raise_unwrapped, unwrap, unwrapped


async def fail(exc: BaseException) -> None:
    raise exc


async def boundary(*errors: BaseException) -> None:
    """A nursery boundary whose tasks raise ``errors`` while its body waits."""
    with unwrap():
        async with trio.open_nursery() as nursery:
            for error in errors:
                nursery.start_soon(fail, error)
            await trio.sleep_forever()  # cancelled by the failure: a Cancelled beside it


@asynccontextmanager
async def owner() -> AsyncIterator[trio.Nursery]:
    """An ``@asynccontextmanager`` that owns a nursery, as ``RpcClient.spawn`` does."""
    with unwrap():
        async with trio.open_nursery() as nursery:
            yield nursery
            nursery.cancel_scope.cancel()


async def body_raises(error: BaseException) -> None:
    async with owner() as nursery:
        nursery.start_soon(trio.sleep_forever)
        raise error


async def task_raises(error: BaseException) -> None:
    async with owner() as nursery:
        nursery.start_soon(fail, error)
        await trio.sleep_forever()


async def test_one_error_leaves_as_itself_with_its_cause_and_context() -> None:
    cause, context = KeyError("cause"), LookupError("context")
    error = ValueError("the one")
    error.__cause__, error.__context__ = cause, context
    with pytest.raises(ValueError, match="the one") as caught:
        await boundary(error)
    assert caught.value is error
    assert (caught.value.__cause__, caught.value.__context__) == (cause, context)


async def test_a_cancellation_leaves_as_itself_for_its_scope() -> None:
    with trio.move_on_after(0.01) as scope:
        await boundary()
    assert scope.cancelled_caught


async def test_several_errors_stay_a_group() -> None:
    with pytest.RaisesGroup(ValueError, KeyError):
        await boundary(ValueError(), KeyError())


def test_an_interrupt_wins_over_what_it_caused() -> None:
    group = BaseExceptionGroup("", [OSError(errno.EPIPE, "broken"), KeyboardInterrupt()])
    found = unwrapped(group)
    assert isinstance(found, KeyboardInterrupt)
    assert found.__cause__ is group
    with pytest.raises(KeyboardInterrupt):
        raise_unwrapped(group)


async def test_an_asynccontextmanager_that_owns_a_nursery_keeps_exceptions_as_they_are() -> None:
    body = RuntimeError("the body's")
    with pytest.raises(RuntimeError, match="the body's") as caught:
        await body_raises(body)
    assert caught.value is body
    assert caught.value.__context__ is None  # the group it left the nursery in is not chained
    with pytest.raises(OSError, match="a task's"):  # a task's failure cancels the body
        await task_raises(OSError("a task's"))
    with trio.move_on_after(0.01) as scope:  # a cancellation of the body, for its scope
        async with owner():
            await trio.sleep_forever()
    assert scope.cancelled_caught


def test_chain_finds_an_errno_inside_a_group_under_a_cause() -> None:
    refused = ConnectionRefusedError(errno.ECONNREFUSED, "refused")
    top = OSError("all attempts to connect failed")
    top.__cause__ = ExceptionGroup("one per address", [OSError("no errno"), refused])
    assert refused in list(chain(top))
    assert [e for e in chain(top) if getattr(e, "errno", None)] == [refused]
