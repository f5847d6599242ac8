"""The one place that looks inside exception groups (STYLE: keep ``ExceptionGroup`` out of the API).

trio nurseries wrap what their tasks raise in a ``BaseExceptionGroup``. Our policy, used at every
nursery boundary that faces a caller (``unwrapped`` says what a group stands for):

* a group of nothing but ``trio.Cancelled`` is a cancellation (``only_cancelled``): the boundary
  re-raises its first ``Cancelled``, and the cancel scope that was cancelled catches it as such;
* a group with exactly one real error (others only ``Cancelled``) is that error: the boundary
  re-raises it as itself (``single_error``), so callers catch ``OSError``, not a group;
* a group of several real errors of which one is a ``KeyboardInterrupt`` is an interrupt:
  Ctrl-C wins over what it caused in other tasks (a new ``KeyboardInterrupt`` whose cause is
  the group, so nothing is lost from the traceback);
* anything else stays a group: several independent failures are all reported.

How to apply it: ``with unwrap():`` around the ``async with trio.open_nursery()`` of a boundary
(also inside an ``@asynccontextmanager``, around its ``yield``: the body's own exception then
leaves as itself), or ``raise_unwrapped(group)`` in an ``except BaseExceptionGroup`` clause.
An error re-raised as itself keeps its ``__cause__`` and ``__context__``: the group it came in
is not chained to it.

``chain`` is the other use, for describing a failure rather than deciding what is raised: every
exception a failure is made of (group members, causes, contexts), to look for a detail such as
the ``errno`` of a connection that trio tried on several addresses.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import NoReturn

import trio

__all__ = ["chain", "leaves", "only_cancelled", "raise_unwrapped", "single_error", "unwrap",
           "unwrapped"]


def leaves(exc: BaseException) -> list[BaseException]:
    """The exceptions inside ``exc`` (itself when it is not a group), groups flattened."""
    if not isinstance(exc, BaseExceptionGroup):
        return [exc]
    out: list[BaseException] = []
    for inner in exc.exceptions:
        out += leaves(inner)
    return out


def only_cancelled(exc: BaseException) -> bool:
    """``trio.Cancelled``, alone or as the only kind of exception in a (nested) group."""
    return all(isinstance(e, trio.Cancelled) for e in leaves(exc))


def single_error(exc: BaseException) -> BaseException | None:
    """The one real error of a group (``Cancelled`` aside), the lone ``Cancelled`` of a group
    of cancellations, or None when the group holds several real errors."""
    found = leaves(exc)
    real = [e for e in found if not isinstance(e, trio.Cancelled)]
    if len(real) == 1:
        return real[0]
    if not real and found:
        return found[0]
    return None


def unwrapped(exc: BaseException) -> BaseException:
    """What ``exc`` stands for under the policy above: its single error, a new
    ``KeyboardInterrupt`` (caused by the group) for several errors among them an interrupt,
    else ``exc`` itself (also when it is not a group)."""
    if not isinstance(exc, BaseExceptionGroup):
        return exc
    single = single_error(exc)
    if single is not None:
        return single
    if any(isinstance(e, KeyboardInterrupt) for e in leaves(exc)):
        interrupt = KeyboardInterrupt()
        interrupt.__cause__ = exc
        return interrupt
    return exc


def raise_unwrapped(exc: BaseException) -> NoReturn:
    """Raise what ``exc`` stands for (``unwrapped``). An error taken out of a group is raised
    as itself: its ``__cause__`` and ``__context__`` stay what they were, the group is not
    chained to it (``raise inner from None`` would erase its cause; a bare ``raise inner`` in
    the ``except`` clause would chain the group that holds it)."""
    __tracebackhide__ = True  # pytest: the frame of the error's origin is the interesting one
    error = unwrapped(exc)
    context = error.__context__
    try:
        raise error
    finally:
        error.__context__ = context
        del error, context  # no reference cycle through this frame


@contextmanager
def unwrap() -> Iterator[None]:
    """Apply the policy to a group leaving the block (``raise_unwrapped``); anything else
    passes untouched. A synchronous context manager, so it adds no checkpoint and can wrap an
    ``async with`` whose body is cancelled: the ``Cancelled`` then leaves as itself."""
    try:
        yield
    except BaseExceptionGroup as group:
        raise_unwrapped(group)


def chain(exc: BaseException) -> Iterator[BaseException]:
    """``exc``, the members of every group in it and the causes (else contexts) of each, every
    exception once, nearest first. For finding a detail (an ``errno``) to describe a failure
    with; what to raise is ``unwrapped``'s business."""
    seen: set[int] = set()
    pending: list[BaseException] = [exc]
    while pending:
        current = pending.pop(0)
        if id(current) in seen:
            continue
        seen.add(id(current))
        yield current
        if isinstance(current, BaseExceptionGroup):  # trio: one error per address tried
            pending += current.exceptions
        if (cause := current.__cause__ or current.__context__) is not None:
            pending.append(cause)
