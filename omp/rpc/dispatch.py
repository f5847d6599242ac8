"""Dispatch: the one way every front runs a command (the RPC reader and lanes, ``omp -p`` and
``--mode json``, each ACP session's prompt).

Three steps, each the same for every front (docs/internals.md#command-lanes):

* ``admit`` routes the command by the route table of ``omp.rpc.commands`` and holds its family's
  cancel scope in the abort registry, now: the RPC reader admits a line before it reads the
  next one, so an ``abort`` right behind a command finds its work;
* ``answer`` runs the handler (a scoped one with its scope, any other inside it, answered as
  cancelled work when the scope was cancelled), turns any ``Exception`` of a handler into an
  internal-error response naming it, and releases the scope;
* ``settle`` runs what the route says follows the response once the front has delivered it, and
  waits for an extension command the handler started to reach its first wait.

``dispatch`` is the three in a row, for a front that runs one command at a time and delivers
the response itself.
"""

from __future__ import annotations

from typing import NamedTuple

import trio

from ..protocol.frames import Response
from .commands import Commands, Frame, Route


class Admission(NamedTuple):
    """A command read and routed, its work's scope (if any) already in the abort registry."""

    route: Route
    scope: trio.CancelScope | None


def admit(commands: Commands, frame: Frame) -> Admission:
    """Route ``frame`` and hold its family's cancel scope in the abort registry, now."""
    route = commands.route(frame)
    scope = None if route.family is None else commands.aborts.hold(route.family)
    return Admission(route, scope)


async def answer(commands: Commands, frame: Frame, admission: Admission) -> Response:
    """Run the admitted command's handler and return its response: a scoped handler with its
    scope, any other inside it (cancelled, it is answered as cancelled work); any ``Exception``
    of a handler becomes an internal-error response naming it, so one bug never takes a front
    down. The scope leaves the registry when the handler is done.

    On cancellation from outside the scope (the front shutting down), ``Cancelled`` propagates
    and the scope is released all the same."""
    route, scope = admission
    try:
        if route.scoped:
            response = route.handler(frame, scope)
        elif scope is None:
            response = route.handler(frame)
        else:
            with scope:
                response = route.handler(frame)
                if not isinstance(response, Response):
                    response = await response
            if scope.cancelled_caught:
                return commands.cancelled(frame)
        if not isinstance(response, Response):
            response = await response
        return response
    except Exception as exc:  # a handler bug must not take the front down
        return commands.internal_error(frame, exc)
    finally:
        if scope is not None:
            commands.aborts.release(scope)


async def settle(commands: Commands, admission: Admission, response: Response, *,
                 lane: bool = True) -> None:
    """What follows a response once the front has delivered it: the route's ``after`` (no
    checkpoint between), then, for a command that held the front's lane (``lane``; a ``task``
    command holds none), when its handler started an extension command, wait until that
    command has run to its first wait, so what it does at once (``ctx.shutdown()``) applies to
    every later command. On cancellation it stops waiting."""
    if admission.route.after is not None:
        admission.route.after(response)
    if lane and (entered := commands.take_command_entered()) is not None:
        await entered.wait()


async def dispatch(commands: Commands, frame: Frame) -> Response:
    """Admit, answer and settle one command, for a front that runs one command at a time and
    delivers the response itself (``omp -p``, an ACP session's prompt). On cancellation as
    ``answer``."""
    admission = admit(commands, frame)
    response = await answer(commands, frame, admission)
    await settle(commands, admission, response)
    return response
