"""The ACP process: ``serve_acp`` on any pair of trio streams, ``run_acp`` on stdio.

Not ``omp.rpc.lifecycle.run_lifecycle``: that one serves one ``Runtime`` (one session) for
its whole life, while an ACP server starts and closes sessions as the editor asks. The parts
are the same: the output queue, the writer and the stop signals (``omp.rpc.lifecycle.Wiring``),
``build_runtime`` for each session, the stdio handling (``StdioStreams``: fd 1 points at
stderr meanwhile, so a stray print never corrupts the protocol), ``private_memory`` and
``adopt_orphans`` (omp.process).

Shutdown, when stdin ends or at the first SIGTERM / SIGHUP / SIGINT: every session is closed
(its run aborted, its prompt answered), requests still running get ``SHUTDOWN_GRACE``
seconds and are then answered with an error, the output is drained while the client reads,
and the process exits 0. A second signal cancels everything at once.
"""

from __future__ import annotations

import sys

import trio

from ..config import ConfigError
from ..groups import unwrap
from ..llm.models import ModelRegistry
from ..process import adopt_orphans, can_watch_signals, hide_environment_block, private_memory
from ..rpc.lifecycle import StdioStreams, Wiring, new_output
from ..rpc.options import ServeOptions
from ..subprocess_env import EnvironmentPolicy
from .server import SHUTDOWN_GRACE, AcpServer

TTY_HINT = ("omp acp: ACP server speaking JSON-RPC over stdio.\n"
            "Start it from an editor that speaks the Agent Client Protocol (Zed, JetBrains ...);\n"
            "it reads one JSON-RPC message per line. Ctrl-D ends it.")


async def serve_acp(options: ServeOptions, stdin: trio.abc.ReceiveStream,
                    stdout: trio.abc.SendStream, *, signals: bool = False,
                    task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Serve ACP until ``stdin`` ends (or a stop signal, with ``signals``). Raises
    ``OutputClosedError`` when ``stdout`` broke, ``KeyboardInterrupt`` after a SIGINT. On
    cancellation everything is cancelled at once (each session closes its HTTP client within
    its own deadline)."""
    output = new_output(options, encoder_limit=sys.maxsize)
    reading = trio.CancelScope()
    wiring = Wiring(output, lambda _signum: reading.cancel())  # the first: as at EOF

    with unwrap():
        async with trio.open_nursery() as root:
            await wiring.start(root, stdout, signals=signals)
            async with trio.open_nursery() as sessions:
                async with trio.open_nursery() as requests:
                    server = AcpServer(options, output, sessions_nursery=sessions,
                                       requests_nursery=requests)
                    task_status.started()
                    with reading:
                        await server.read(stdin)
                    with trio.move_on_after(SHUTDOWN_GRACE):
                        await server.close_all()
                    # What is still running (a prompt waiting for a client answer) is cut off
                    # after the grace; each answers with an error as it is cancelled.
                    requests.cancel_scope.deadline = trio.current_time() + SHUTDOWN_GRACE
                sessions.cancel_scope.cancel()  # sessions opened during the shutdown
            await wiring.finish()
    wiring.raise_outcome()


def _secrets_policy() -> EnvironmentPolicy:
    """The variables every session of this process keeps from its children: the default
    excludes and the provider key variables (``models.yml`` ones included; a file that does
    not load leaves the default excludes, and the session that reads it says why)."""
    try:
        names = ModelRegistry.load().key_variables()
    except (ConfigError, OSError):
        names = frozenset()
    return EnvironmentPolicy(provider_variables=names)


async def run_acp(options: ServeOptions) -> None:
    """``serve_acp`` on the process's stdio (``omp acp``), the secrets of the environment gone
    from the block ``/proc/<pid>/environ`` shows (``omp.process.hide_environment_block``).
    Raises as ``serve_acp``. On cancellation everything is cancelled at once, as in
    ``serve_acp``; then the orphans still running are ended and reaped (``adopt_orphans``:
    shielded, bounded), stdio is given back, and ``Cancelled`` propagates."""
    if sys.stdin.isatty():
        print(TTY_HINT, file=sys.stderr)
    hide_environment_block(_secrets_policy().is_secret)
    with StdioStreams() as (stdin, stdout), private_memory():
        async with adopt_orphans():
            await serve_acp(options, stdin, stdout, signals=can_watch_signals())
