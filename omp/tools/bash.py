"""The ``bash`` tool (agent-core §10.2), and the RPC ``bash`` command's ``BashResult``
(rpc-behavior §10.2). Both run commands through ``shell.ShellRun``, and both show an output over
the limit the same way: its head and its tail with the middle elided (``truncate.MiddleElider``),
naming the temp file that holds the full output.

Tool results:

* the output (whole, or middle-elided) or ``(no output)``; when elided, a notice follows:
  ``[Showing lines 1-H and T-N of N (<size> elided). Full output: <path>]``;
  ``details`` then has ``truncation`` (how it was cut) and ``fullOutputPath``;
* exit code != 0: an error, ``<text>\\n\\nCommand exited with code N``;
* timeout: an error, ``<text>\\n\\nCommand timed out after N seconds``;
* abort: ``Cancelled`` propagates once the process group is dead; the agent loop writes the
  aborted result.

In ACP mode, when the editor offers terminals, the command runs in one of them instead
(``omp.tools.bash_terminal``), with the same results.
"""

from __future__ import annotations

from typing import Any

import attrs
import trio
from msgspec import UNSET

from ..groups import unwrap
from ..protocol.payloads import BashResult
from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .bash_terminal import run_in_terminal
from .shell import ShellResult, ShellRun, ShellSpawnError
from .specs import SPECS, SpecifiedTool
from .truncate import Elision, format_size

UPDATE_INTERVAL = 0.1
"""At most this often (seconds) a streaming update goes to ``on_update``."""

DESCRIPTION = SPECS['bash'].description

PARAMETERS: dict[str, Any] = SPECS['bash'].parameters


def format_seconds(value: float) -> str:
    """A number of seconds as JavaScript prints it: ``5``, ``0.5``."""
    return str(int(value)) if float(value).is_integer() else repr(float(value))


def _details(elision: Elision, full_output_path: object) -> dict[str, Any] | None:
    details: dict[str, Any] = {}
    if (truncation := elision.details()) is not None:
        details["truncation"] = truncation
    if full_output_path is not None:
        details["fullOutputPath"] = str(full_output_path)
    return details or None


def elision_notice(elision: Elision, full_output_path: object) -> str:
    """The line that follows a middle-elided output in the tool result ("" when not elided)."""
    if not elision.truncated:
        return ""
    full = f" Full output: {full_output_path}" if full_output_path is not None else ""
    return (f"[Showing lines 1-{elision.head_lines} and {elision.tail_first_line}-"
            f"{elision.total_lines} of {elision.total_lines} "
            f"({format_size(elision.elided_bytes)} elided).{full}]")


def tool_output_text(result: ShellResult) -> str:
    """The output as the model reads it: whole or middle-elided (or ``(no output)``), and the
    notice naming the full output's file when elided."""
    text = result.truncation.content or "(no output)"
    notice = elision_notice(result.truncation, result.full_output_path)
    return f"{text}\n\n{notice}" if notice else text


@attrs.define
class BashTool(SpecifiedTool):
    ctx: ToolContext

    spec = SPECS['bash']

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Run the command in the session cwd, streaming its output (middle-elided when long).

        On cancellation (abort) the command's process group is killed and waited for, no
        further update is sent, and ``Cancelled`` propagates.
        """
        command = args["command"]
        timeout = args.get("timeout")
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            timeout = None
        if self.ctx.terminals is not None:  # ACP: the editor runs it where the user sees it
            ran = await run_in_terminal(self.ctx.terminals, command, cwd=self.ctx.cwd,
                                        timeout=timeout, on_update=on_update)
            return outcome(ran.text, ran.details, timed_out=ran.timed_out,
                           exit_code=ran.exit_code, timeout=timeout)
        changed = trio.Event()

        async def on_output(_: str) -> None:
            changed.set()

        run = ShellRun(command, cwd=self.ctx.cwd, timeout=timeout, on_output=on_output,
                       environment=self.ctx.environment)
        sent_bytes = -1  # total_bytes at the last update sent

        async def send_update() -> None:
            nonlocal sent_bytes
            total = run.total_bytes
            shown = run.snapshot()
            await on_update(ToolResult.text(shown.content, _details(shown, run.full_output_path)))
            sent_bytes = total

        async def stream_updates() -> None:
            nonlocal changed
            while True:
                await changed.wait()
                changed = trio.Event()
                await send_update()
                await trio.sleep(UPDATE_INTERVAL)

        try:
            with unwrap():  # one real error inside the nursery's group leaves as itself
                async with trio.open_nursery() as nursery:
                    nursery.start_soon(stream_updates)
                    await run.run()
                    nursery.cancel_scope.cancel()
        except ShellSpawnError as exc:
            raise ToolError(str(exc)) from None  # its text says why (the OSError included)
        if run.total_bytes != sent_bytes and run.total_bytes:
            await send_update()  # the last state is always sent

        result = run.result()
        return outcome(tool_output_text(result),
                       _details(result.truncation, result.full_output_path),
                       timed_out=result.timed_out, exit_code=result.exit_code, timeout=timeout)


def outcome(text: str, details: Any, *, timed_out: bool, exit_code: int | None,
            timeout: float | None) -> ToolResult:
    """The tool's result for a finished command (local or in the editor's terminal): the
    output, or an error for a timeout or a non-zero exit."""
    if timed_out:
        prefix = "" if text == "(no output)" else f"{text}\n\n"
        raise ToolError(f"{prefix}Command timed out after {format_seconds(timeout or 0)} "
                        "seconds", details)
    if exit_code:
        raise ToolError(f"{text}\n\nCommand exited with code {exit_code}", details)
    return ToolResult.text(text, details)


def _count_lines(text: str) -> int:
    return text.count("\n") + 1 if text else 0


def bash_result(result: ShellResult) -> BashResult:
    """The RPC ``bash`` command's response data (rpc-behavior §10.2).

    ``output`` is the whole output, or its head and tail around the elision marker line (no
    notice: ``truncated``, ``elidedLines``, ``elidedBytes`` and ``fullOutputPath`` say it),
    prefixed with ``[Command cancelled]\\n`` or ``[Command timed out after N seconds]\\n``; a
    timeout also counts as ``cancelled``. ``exitCode`` and ``workingDir`` (the command's cwd: a
    ``cd`` does not outlive its command) only on normal completion.
    """
    output = result.output
    if result.timed_out:
        output = f"[Command timed out after {format_seconds(result.timeout or 0)} seconds]\n" \
            + output
    elif result.cancelled:
        output = "[Command cancelled]\n" + output
    completed = not (result.cancelled or result.timed_out) and result.exit_code is not None
    elision = result.truncation
    return BashResult(
        output=output,
        cancelled=not completed,
        truncated=result.truncation.truncated,
        totalLines=result.total_lines,
        totalBytes=result.total_bytes,
        outputLines=_count_lines(output),
        outputBytes=len(output.encode("utf-8", "surrogatepass")),
        exitCode=result.exit_code if completed and result.exit_code is not None else UNSET,
        fullOutputPath=(str(result.full_output_path) if result.full_output_path is not None
                        else UNSET),
        workingDir=str(result.cwd) if completed else UNSET,
        timedOut=result.timed_out,
        elidedLines=elision.elided_lines if elision.truncated else UNSET,
        elidedBytes=elision.elided_bytes if elision.truncated else UNSET,
    )
