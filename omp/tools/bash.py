"""The ``bash`` tool (docs/design/agent-loop.md#bash), and the RPC ``bash`` command's ``BashResult``
(docs/design/protocol.md#bashresult). Both run commands through ``shell.ShellRun``, and both show an
output over the limit the same way: its head and its tail with the middle elided
(``truncate.MiddleElider``), naming the temp file that holds the full output.

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

Background jobs (``ToolContext.jobs``, a main session's ``omp.session.jobs``; the original's
rules). A command becomes a job of the session, and the call answers at once with the
original's text (``Backgrounded as job bg_N; result will be delivered automatically.``, after
the output so far):

* with ``async: true`` (when ``async.enabled``), before it starts;
* when it is still running ``bash.autoBackground.thresholdMs`` after it started (at most the
  call's ``timeout`` less a second), with ``bash.autoBackground.enabled``;
* when the user steers while it runs (``interruptMode: immediate``: the loop's ``steered``),
  with ``Backgrounded early to handle an incoming message; the command keeps running.``
  before it, so the steering reaches the model without waiting for the command.

The command is not restarted: the call runs it through ``BackgroundJobs.hand_off``, so the
running process is moved, its task reparented into the session nursery. From then on its whole
output is kept in a spill file (named in ``details.fullOutputPath`` and in the delivery), and
when it ends its result (the text the call would have had) is delivered to the model once. A
``pty`` command (which has no terminal here: the original's notice says so), a command in the
editor's terminal, a subagent's, and any while ``async.maxJobs`` jobs run stay in their call.
"""

from __future__ import annotations

import functools
from pathlib import Path
from typing import Any

import attrs
import trio
from msgspec import UNSET

from ..groups import unwrap
from ..protocol.messages import TextContent
from ..protocol.payloads import BashResult
from ..subprocess_env import EnvironmentPolicy
from .base import (
    BackgroundJobs,
    HandOff,
    JobRefused,
    OnUpdate,
    Settled,
    ToolContext,
    ToolError,
    ToolResult,
)
from .bash_terminal import run_in_terminal
from .shell import ShellResult, ShellRun, ShellSpawnError
from .specs import SPECS, SpecifiedTool
from .truncate import Elision, format_size

UPDATE_INTERVAL = 0.1
"""At most this often (seconds) a streaming update goes to ``on_update``."""

PTY_UNAVAILABLE = "pty requested but unavailable in this environment; ran without a terminal"
STEERED_AWAY = ("Backgrounded early to handle an incoming message; the command keeps "
                "running.")

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
        """Run the command in the session cwd, streaming its output (middle-elided when long);
        or, as the module docstring says, as a background job: at once (``async``), or once
        it has run ``bash.autoBackground.thresholdMs`` or ``steered`` is set.

        On cancellation (abort) while the command is the call's, its process group is killed
        and waited for, no further update is sent, and ``Cancelled`` propagates. A command
        that became a job is not the call's any more: the abort does not reach it.
        """
        command = args["command"]
        timeout = args.get("timeout")
        if not isinstance(timeout, int | float) or isinstance(timeout, bool) or timeout <= 0:
            timeout = None
        pty = args.get("pty") is True
        notices = [PTY_UNAVAILABLE] if pty else []
        jobs = self.ctx.jobs
        if args.get("async") is True:
            return self._start_job(jobs, command, timeout, notices)
        if self.ctx.terminals is not None:  # ACP: the editor runs it where the user sees it
            ran = await run_in_terminal(self.ctx.terminals, command, cwd=self.ctx.cwd,
                                        timeout=timeout, on_update=on_update)
            return outcome(ran.text, ran.details, timed_out=ran.timed_out,
                           exit_code=ran.exit_code, timeout=timeout, notices=notices)
        call = _CallCommand(command, self.ctx.cwd, timeout, self.ctx.environment, on_update)
        # A terminal command runs alone and in its call (the original's rule for ``pty``).
        wait = (None if pty or jobs is None or jobs.at_capacity
                else auto_background_wait(jobs.auto_background_after(), timeout))
        answer: ToolResult | None = None
        if jobs is not None and wait is not None:
            try:
                answer = await jobs.hand_off(functools.partial(
                    call.leave_when_due, wait, steered, notices))
            except JobRefused:  # the session closes: nothing becomes a job any more
                await call.run_here()
        else:
            await call.run_here()
        if answer is not None:
            return answer
        await call.last_update()
        return call.result(notices)

    def _start_job(self, jobs: BackgroundJobs | None, command: str, timeout: float | None,
                   notices: list[str]) -> ToolResult:
        """``async: true``: the command starts as a background job; the call answers at
        once."""
        if jobs is None:
            raise ToolError("Async job manager unavailable for this session.")
        if not jobs.async_enabled:
            raise ToolError("Async bash execution is disabled. Enable async.enabled to use "
                            "async mode.")
        run = ShellRun(command, cwd=self.ctx.cwd, timeout=timeout,
                       environment=self.ctx.environment, keep_whole=True)

        async def job() -> Settled:
            started = trio.current_time()
            try:
                await run.run()
            except ShellSpawnError as exc:
                return Settled(str(exc), "failed", (trio.current_time() - started) * 1000)
            return job_settled(run.result(), notices, trio.current_time() - started)

        try:
            job_id = jobs.launch("bash", label_of(command), job)
        except JobRefused as exc:
            raise ToolError(str(exc)) from None
        return background_result(job_id, "", notices, None)


@attrs.define(eq=False)
class _CallCommand:
    """A command run by a call: its output streamed to the call (``tool_execution_update``)
    for as long as it is the call's. Its ``ShellRun`` is built here, telling it of each
    chunk of output."""

    command: str
    cwd: Path
    timeout: float | None
    environment: EnvironmentPolicy
    on_update: OnUpdate
    run: ShellRun = attrs.field(init=False)
    changed: trio.Event = attrs.field(factory=trio.Event)
    done: trio.Event = attrs.field(factory=trio.Event)
    spawn_error: ShellSpawnError | None = None
    sent_bytes: int = -1
    """``total_bytes`` at the last update sent."""

    def __attrs_post_init__(self) -> None:
        self.run = ShellRun(self.command, cwd=self.cwd, timeout=self.timeout,
                            environment=self.environment, on_output=self._output)

    async def _output(self, _: str) -> None:
        self.changed.set()

    async def _send_update(self) -> None:
        total = self.run.total_bytes
        shown = self.run.snapshot()
        await self.on_update(ToolResult.text(shown.content,
                                             _details(shown, self.run.full_output_path)))
        self.sent_bytes = total

    async def _stream_updates(self, scope: trio.CancelScope) -> None:
        with scope:
            while True:
                await self.changed.wait()
                self.changed = trio.Event()
                await self._send_update()
                await trio.sleep(UPDATE_INTERVAL)

    async def _run_to_end(self) -> None:
        try:
            await self.run.run()
        except ShellSpawnError as exc:
            self.spawn_error = exc
        finally:
            self.done.set()

    async def run_here(self) -> None:
        """Run the command to its end in the call, streaming updates. On cancellation the
        process group is killed and ``Cancelled`` propagates."""
        with unwrap():  # one real error inside the nursery's group leaves as itself
            async with trio.open_nursery() as nursery:
                streaming = trio.CancelScope()
                nursery.start_soon(self._stream_updates, streaming)
                await self._run_to_end()
                streaming.cancel()

    async def last_update(self) -> None:
        if self.run.total_bytes != self.sent_bytes and self.run.total_bytes:
            await self._send_update()  # the last state is always sent

    def result(self, notices: list[str]) -> ToolResult:
        """The call's result once the command ended in it; raises ToolError as ``outcome``."""
        if self.spawn_error is not None:
            raise ToolError(str(self.spawn_error))  # its text says why (the OSError included)
        result = self.run.result()
        return outcome(tool_output_text(result),
                       _details(result.truncation, result.full_output_path),
                       timed_out=result.timed_out, exit_code=result.exit_code,
                       timeout=result.timeout, notices=notices)

    async def leave_when_due(self, wait: float, steered: trio.Event | None,
                             notices: list[str], hand: HandOff[ToolResult | None]
                             ) -> Settled | None:
        """Run the command in the call until it ends (``finish(None)``), or until ``wait``
        seconds have passed or ``steered`` is set: then it becomes a job
        (``hand.background``) and the call gets the original's background result. As a job
        its end is what this returns. On cancellation while it is the call's, the process
        group is killed and ``Cancelled`` propagates."""
        started = trio.current_time()
        with unwrap():  # one real error inside the nursery's group leaves as itself
            async with trio.open_nursery() as nursery:
                nursery.start_soon(self._run_to_end)
                streaming = trio.CancelScope()
                nursery.start_soon(self._stream_updates, streaming)
                with trio.move_on_after(wait):
                    await _either(self.done, steered)
                kept = None if self.done.is_set() else await self.run.keep_output()
                if self.done.is_set():  # (also when it ended while its file was made)
                    streaming.cancel()
                    hand.finish(None)
                    return None
                said = list(notices)
                if steered is not None and steered.is_set():
                    said.append(STEERED_AWAY)
                preview = self.run.snapshot().content
                streaming.cancel()  # no update once the call has its answer
                if not hand.background("bash", label_of(self.run.command),
                                       lambda job_id: background_result(job_id, preview, said,
                                                                        kept)):
                    # No job can start (the limit was reached meanwhile): it stays the call's.
                    await self.done.wait()
                    hand.finish(None)
                    return None
                await self.done.wait()
        if self.spawn_error is not None:
            return Settled(str(self.spawn_error), "failed",
                           (trio.current_time() - started) * 1000)
        return job_settled(self.run.result(), notices, trio.current_time() - started)


async def _either(first: trio.Event, second: trio.Event | None) -> None:
    """Wait until ``first`` or ``second`` is set."""
    if second is None:
        await first.wait()
        return
    async with trio.open_nursery() as nursery:
        async def wait_for(event: trio.Event) -> None:
            await event.wait()
            nursery.cancel_scope.cancel()

        nursery.start_soon(wait_for, first)
        nursery.start_soon(wait_for, second)


def auto_background_wait(threshold: float | None, timeout: float | None) -> float | None:
    """Seconds a command runs in its call before it becomes a job (0: it starts as one);
    None: it stays the call's. The call's own timeout less a second bounds the wait, so a
    command about to time out ends in its call (the original's rule); a timeout shorter than
    that keeps the command in its call (where the original would start it as a job at
    once: a command that ends within a second has nothing to wait for)."""
    if threshold is None:
        return None
    if threshold <= 0:
        return 0.0
    if timeout is None:
        return threshold
    wait = min(threshold, timeout - 1.0)
    return wait if wait > 0 else None


def label_of(command: str) -> str:
    """A command as ``/jobs`` names its job (the original's cut)."""
    return command if len(command) <= 120 else command[:117] + "..."


def background_result(job_id: str, preview: str, notices: list[str],
                      output_file: Path | None) -> ToolResult:
    """The call's answer when its command became job ``job_id`` (the original's text): the
    output so far, the notices, then where the result will come from."""
    lines: list[str] = []
    if preview.rstrip():
        lines += [preview.rstrip(), ""]
    if notices:
        lines += [*notices, ""]
    lines.append(f"Backgrounded as job {job_id}; result will be delivered automatically.")
    details: dict[str, Any] = {"async": {"state": "running", "jobId": job_id, "type": "bash"}}
    if output_file is not None:
        details["fullOutputPath"] = str(output_file)
    return ToolResult.text("\n".join(lines), details)


def job_settled(result: ShellResult, notices: list[str], seconds: float) -> Settled:
    """A command job's end as the model is told it: the call's result text (an error one
    for a failure), its whole output kept in ``output_file``."""
    try:
        text = outcome(tool_output_text(result), None, timed_out=result.timed_out,
                       exit_code=result.exit_code, timeout=result.timeout,
                       notices=notices).content[0]
        assert isinstance(text, TextContent)
        return Settled(text.text, "completed", seconds * 1000, result.full_output_path)
    except ToolError as exc:
        return Settled(str(exc), "failed", seconds * 1000, result.full_output_path)


def outcome(text: str, details: Any, *, timed_out: bool, exit_code: int | None,
            timeout: float | None, notices: list[str] | None = None) -> ToolResult:
    """The tool's result for a finished command (local or in the editor's terminal): the
    output and its notices, or an error for a timeout or a non-zero exit."""
    if notices:
        text = f"{text}\n\n" + "\n".join(notices)
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
    """The RPC ``bash`` command's response data (docs/design/protocol.md#bashresult).

    ``output`` is the whole output, or its head and tail around the elision marker line (no
    notice: ``truncated``, ``elidedLines``, ``elidedBytes`` and ``fullOutputPath`` say it),
    prefixed with ``[Command cancelled]\\n`` or ``[Command timed out after N seconds]\\n``; a
    timeout also counts as ``cancelled``. ``outputLines`` and ``outputBytes`` count the
    command's output as shown, without that notice line (as the original counts them), so a
    cancelled command's output that was not cut has ``totalLines`` lines.
    ``exitCode`` and ``workingDir`` (the command's cwd: a ``cd`` does not outlive its command)
    only on normal completion.
    """
    shown = result.output
    output = shown
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
        outputLines=_count_lines(shown),
        outputBytes=len(shown.encode("utf-8", "surrogatepass")),
        exitCode=result.exit_code if completed and result.exit_code is not None else UNSET,
        fullOutputPath=(str(result.full_output_path) if result.full_output_path is not None
                        else UNSET),
        workingDir=str(result.cwd) if completed else UNSET,
        timedOut=result.timed_out,
        elidedLines=elision.elided_lines if elision.truncated else UNSET,
        elidedBytes=elision.elided_bytes if elision.truncated else UNSET,
    )
