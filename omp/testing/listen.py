"""The listening half every fake server of ``omp.testing`` shares: one TCP listener on a
(by default ephemeral) port, and the accept loop that gives each connection its own task.
"""

from __future__ import annotations

import errno
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import asynccontextmanager, suppress

import trio

_CAPACITY_ERRNOS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOMEM, errno.ENOBUFS})
"""accept() failures that mean "too many connections for now", not a broken listener."""


@asynccontextmanager
async def one_listener(host: str, port: int) -> AsyncIterator[tuple[trio.SocketListener, str]]:
    """The listener on ``host:port`` and its address as a URL authority (``127.0.0.1:PORT``,
    ``[::1]:PORT``). A name with several addresses gets one listener per address, each with
    its own ephemeral port: the first is kept, so a fake has one address. Leaving the block
    closes it. On cancellation, while it opens or in the block, every listener it opened is
    closed (``aclose_forcefully``) and ``Cancelled`` propagates."""
    listeners = await trio.open_tcp_listeners(port, host=host)
    try:
        for extra in listeners[1:]:
            await trio.aclose_forcefully(extra)
        listener = listeners[0]
        address, bound_port = listener.socket.getsockname()[:2]
        shown = f"[{address}]" if ":" in address else address
        yield listener, f"{shown}:{bound_port}"
    finally:
        for each in listeners:
            with suppress(OSError):
                await trio.aclose_forcefully(each)


async def accept_forever(listener: trio.SocketListener,
                         handle: Callable[[trio.SocketStream], Awaitable[object]]) -> None:
    """Run ``handle`` for every connection, each in its own task, until cancelled; then every
    connection task is cancelled too.

    Our own loop rather than ``trio.serve_listeners``: a connection's task ends right after its
    handler (a fake's "no connection left" count can then mean "no task left"), and running out
    of descriptors pauses accepting instead of ending the server.
    """
    async with trio.open_nursery() as nursery:
        while True:
            try:
                stream = await listener.accept()
            except OSError as exc:
                if exc.errno not in _CAPACITY_ERRNOS:
                    raise
                await trio.sleep(0.1)  # let connections finish and free descriptors
            else:
                nursery.start_soon(handle, stream)
