"""The one place that looks inside exception groups (STYLE: keep ``ExceptionGroup`` out of the API).

trio nurseries wrap what their tasks raise in a ``BaseExceptionGroup``. Our policy, used at every
nursery boundary that faces a caller:

* a group of nothing but ``trio.Cancelled`` is a cancellation (``only_cancelled``), and the cancel
  scope that was cancelled catches it as such;
* a group with exactly one real error (others only ``Cancelled``) is that error: the boundary
  re-raises it as itself (``single_error``), so callers catch ``OSError``, not a group;
* anything else stays a group: several independent failures are all reported.
"""

from __future__ import annotations

import trio


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
