"""``bash`` in the editor's terminal (ACP ``terminal/*``, docs/guides/acp.md#the-editors-terminals):
when the session has the editor's terminals (``ToolContext.terminals``), the command runs there,
where the user sees it, instead of in a local process.

The sequence, as the original's: ``terminal/create`` (``<shell> -c <command>`` in the session
cwd, at most ``DEFAULT_MAX_BYTES`` of output kept by the editor), a partial result whose
``details.terminalId`` names the terminal (the ACP front end shows it as terminal content of the
tool call), then ``terminal/wait_for_exit`` while ``terminal/output`` is read every
``POLL_INTERVAL`` seconds (a partial result each time the output changed; the original sends one
per poll, changed or not), the final ``terminal/output``, and ``terminal/release`` at the end,
whatever happened. A timeout or an abort first sends ``terminal/kill``.

``omp.tools.bash`` words the result as for a local command (a non-zero exit, 128+N for signal
N, and a timeout are errors); ``(output truncated)`` follows an output the editor cut. Every
result's ``details`` has the ``terminalId``.

Cancellation (abort): ``terminal/kill`` and ``terminal/release`` are sent from a shielded cleanup
with its own deadline (``CLEANUP_SECONDS``), so an editor that does not answer cannot hold the
abort; then ``Cancelled`` propagates.
"""

from __future__ import annotations

import contextlib
import math
import signal
from pathlib import Path
from typing import Any

import attrs
import trio

from ..groups import unwrap
from .base import EditorTerminals, OnUpdate, TerminalExit, ToolError, ToolResult
from .shell import shell_program
from .truncate import DEFAULT_MAX_BYTES

POLL_INTERVAL = 0.25
"""How often (seconds) the output is read while the command runs (the original's 250 ms)."""
CLEANUP_SECONDS = 3.0
"""Deadline of the shielded ``terminal/kill`` + ``terminal/release`` after an abort."""


def exit_status(status: TerminalExit) -> int | None:
    """The exit code, 128+N when signal N ended the command. Raises ToolError for a signal
    name this platform does not know."""
    if status.exit_code is not None:
        return status.exit_code
    if status.signal is None:
        return None
    try:
        number = signal.Signals[status.signal].value
    except KeyError:
        raise ToolError(f'Terminal reported termination by signal "{status.signal}", which is '
                        "not a signal this platform knows. No exit status can be derived from "
                        "it.") from None
    return 128 + number


@attrs.frozen
class TerminalRun:
    """How a command in an editor terminal went; ``omp.tools.bash`` words the result."""

    text: str
    """The output (``(no output)`` when empty), ``(output truncated)`` after it when cut."""
    exit_code: int | None
    timed_out: bool
    details: dict[str, Any]
    """``terminalId``."""


async def run_in_terminal(terminals: EditorTerminals, command: str, *, cwd: Path,
                          timeout: float | None,  # noqa: ASYNC109 (the tool's own argument)
                          on_update: OnUpdate) -> TerminalRun:
    """Run ``command`` in an editor terminal. Raises ToolError when the editor refuses a
    request.

    On cancellation the terminal is killed and released (bounded by ``CLEANUP_SECONDS``) and
    ``Cancelled`` propagates."""
    terminal_id = await terminals.create(shell_program(), ["-c", command], cwd,
                                         DEFAULT_MAX_BYTES)
    details: dict[str, Any] = {"terminalId": terminal_id}
    exited: TerminalExit | None = None
    killed = False
    try:
        await on_update(ToolResult([], details))
        shown: str | None = None

        async def poll() -> None:
            nonlocal shown
            while True:
                await trio.sleep(POLL_INTERVAL)
                current = await terminals.output(terminal_id)
                if current.output != shown:
                    shown = current.output
                    await on_update(ToolResult.text(current.output, details))

        # unwrap: an editor's refusal (ToolError) leaves the nursery as itself, not in a group
        with trio.move_on_after(math.inf if timeout is None else timeout), unwrap():
            async with trio.open_nursery() as nursery:
                nursery.start_soon(poll)
                exited = await terminals.wait_for_exit(terminal_id)
                nursery.cancel_scope.cancel()
        if exited is None:  # timed out
            killed = True
            await terminals.kill(terminal_id)
        final = await terminals.output(terminal_id)
    finally:
        with trio.move_on_after(CLEANUP_SECONDS, shield=True):
            await _close(terminals, terminal_id, kill=exited is None and not killed)
    text = final.output or "(no output)"
    if final.truncated:
        text += "\n\n(output truncated)"
    return TerminalRun(text, None if exited is None else exit_status(exited),
                       exited is None, details)


async def _close(terminals: EditorTerminals, terminal_id: str, *, kill: bool) -> None:
    """Kill (when the command may still run) and release the terminal. A refusal of the
    editor is not the tool's failure: the terminal is the editor's to clean up then."""
    if kill:
        with contextlib.suppress(ToolError):
            await terminals.kill(terminal_id)
    with contextlib.suppress(ToolError):
        await terminals.release(terminal_id)
