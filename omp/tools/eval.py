"""The ``eval`` tool: Python cells in the session's persistent IPython kernel
(``omp.tools.eval_kernel``), started with the first call.

Tool results:

* the cell's output in the order it came: stdout and stderr as printed, the last expression's
  value (its ``text/plain`` form), each display's ``text/plain`` form, and an exception's
  traceback (ANSI colours removed, the dashed rule dropped, at most ``MAX_FRAMES`` frames); or
  ``(no output)``. Each ``image/png`` display is an image block after the text (at most
  ``MAX_IMAGES``, each at most ``MAX_IMAGE_BYTES``; the others are named in the text);
* output over 50 KB is middle-elided as ``bash``'s is (``truncate.MiddleElider``), the whole of
  it kept in a private temp file (``omp-eval-<16 hex>.log``) named in the notice and in
  ``details.fullOutputPath``;
* an exception in the cell: an error result with the output and the traceback;
* a cell still running after ``timeout`` seconds (default ``eval.timeout``, 30; 0: no
  deadline): it is interrupted and the result is an error ending ``Cell timed out after N
  seconds`` (and saying so when the kernel had to be restarted, its names lost);
* the kernel dying in the cell: an error saying so; the next call starts a new kernel, and its
  result begins by saying the names defined before are gone;
* ``language: "js"``: an error (no JavaScript kernel here);
* abort: the cell is interrupted (the kernel restarted if that does not stop it) and
  ``Cancelled`` propagates once the kernel is idle or gone; the agent loop writes the aborted
  result.

``reset: true`` stops the kernel first; the cell runs in a new one. So does a session change
(``new_session``, ``switch_session``, ``open_session``: ``ToolContext.on_session_change``), as
the kernel's names belong to the old transcript; the next call's result does not call that a
lost kernel.
"""

from __future__ import annotations

import base64
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import attrs
import trio

from ..protocol.messages import ImageContent, TextContent
from .base import OnUpdate, ToolContext, ToolError, ToolResult
from .bash import elision_notice, format_seconds
from .eval_settings import DEFAULT_TIMEOUT, MAX_TIMEOUT, EvalSettings
from .shell import create_spill_file, shell_environment
from .specs import EVAL_SPECS, SpecifiedTool
from .truncate import DEFAULT_MAX_BYTES, Elision, MiddleElider

if TYPE_CHECKING:
    # The kernel's module imports jupyter_client and zmq (~0.4 s): in a worker thread, with
    # the first call (``_open_kernel``).
    from .eval_kernel import CellEnd, Kernel, Message

UPDATE_INTERVAL = 0.1
"""At most this often (seconds) a streaming update goes to ``on_update``."""
MAX_FRAMES = 12
"""A traceback with more frames keeps its first 2 and its last ``MAX_FRAMES - 2``."""
SPILL_CHUNK = 1024 * 1024
"""Bytes of an output over the limit held before they are written to its spill file."""
MAX_IMAGES = 8
MAX_IMAGE_BYTES = 4 * 1024 * 1024
"""Of one image's PNG data (decoded); a larger one is named in the text instead."""
NO_JS = ('JavaScript cells are not available here: no JavaScript kernel is configured. '
         'Use language "py".')
KERNEL_LOST = ("[A new Python kernel was started: the previous one had ended, so the names "
               "defined before are gone.]")

_ANSI = re.compile(r"\x1b(?:\[[0-?]*[ -/]*[@-~]|\][^\x07\x1b]*(?:\x07|\x1b\\)|[@-Z\\-_])")
_RULE = re.compile(r"^-{10,}$")


def strip_ansi(text: str) -> str:
    """``text`` without terminal escape sequences (colours, cursor moves, titles)."""
    return _ANSI.sub("", text)


def traceback_text(lines: list[str]) -> str:
    """An ``error`` message's traceback as the model reads it: no colours, no dashed rule, the
    header's padding squeezed, at most ``MAX_FRAMES`` frames."""
    parts = [strip_ansi(line).rstrip("\n") for line in lines]
    parts = [p for p in parts if not _RULE.match(p.strip())]
    if parts:
        parts[0] = re.sub(r"\s{2,}(Traceback \(most recent call last\))", r"  \1", parts[0])
    # The first part is the header, the last the exception line; the frames are between.
    frames = parts[1:-1]
    if len(frames) > MAX_FRAMES:
        kept = MAX_FRAMES - 2
        frames = [*frames[:2], f"[… {len(frames) - 2 - kept} frames elided …]", *frames[-kept:]]
        parts = [parts[0], *frames, parts[-1]]
    return "\n".join(parts)


def cell_timeout(args: dict[str, Any], settings: EvalSettings | None) -> float | None:
    """The call's deadline in seconds (None: none): its ``timeout``, else ``eval.timeout``;
    0 means none; others are kept within 1..``MAX_TIMEOUT``."""
    value = args.get("timeout")
    if not isinstance(value, int | float) or isinstance(value, bool) or value < 0:
        value = settings.timeout if settings is not None else DEFAULT_TIMEOUT
    if value == 0:
        return None
    return float(min(max(value, 1.0), MAX_TIMEOUT))


@attrs.define(eq=False)
class CellOutput:
    """What one cell said, as the model will read it: text bounded like ``bash``'s output
    (middle-elided past ``max_bytes``, the whole of it in a spill file), images apart."""

    max_bytes: int = DEFAULT_MAX_BYTES
    images: list[ImageContent] = attrs.field(factory=list)
    errored: bool = False
    """An ``error`` message came (an exception in the cell)."""
    changed: bool = False
    """Something came since the last ``snapshot``."""
    _elider: MiddleElider = attrs.field(init=False)
    _unspilled: bytearray = attrs.field(factory=bytearray, init=False)
    _spilling: bool = attrs.field(default=False, init=False)
    _spill: tuple[int, Path] | None = attrs.field(default=None, init=False)
    _spill_failed: bool = attrs.field(default=False, init=False)
    _flushing: trio.Lock = attrs.field(factory=trio.Lock, init=False)
    """Held by a ``flush``: the kernel's reader and the call's progress updates both flush, and
    the file must be created once and written in order."""
    _left_out: list[str] = attrs.field(factory=list, init=False)

    @_elider.default
    def _make_elider(self) -> MiddleElider:
        return MiddleElider(max_bytes=self.max_bytes)

    async def take(self, message: Message) -> None:
        """One output message of the cell. Once the output is over the limit, what the spill
        file lacks is written when it reaches ``SPILL_CHUNK`` (so memory stays bounded,
        the reading of the kernel's messages waiting for the disk). Not a checkpoint unless it
        flushes; on cancellation then, as ``flush``: the message itself is in the shown output
        already."""
        self._take(message)
        if len(self._unspilled) >= SPILL_CHUNK:
            await self.flush()

    def _take(self, message: Message) -> None:
        kind, content = message["msg_type"], message.get("content", {})
        if kind == "stream":
            self._text(str(content.get("text", "")))
        elif kind in ("execute_result", "display_data", "update_display_data"):
            data = content.get("data", {})
            png = data.get("image/png")
            if isinstance(png, str):
                self._image(png)
            elif "text/plain" in data:
                self._text(f"{data['text/plain']}\n")
        elif kind == "error":
            self.errored = True
            lines = content.get("traceback") or [
                f"{content.get('ename', 'Error')}: {content.get('evalue', '')}"]
            self._text(traceback_text([str(line) for line in lines]) + "\n")

    def _text(self, text: str) -> None:
        if not text:
            return
        data = text.encode("utf-8", "surrogatepass")
        self._elider.feed(data)
        self.changed = True
        if not self._spill_failed:
            self._unspilled += data
            self._spilling = self._spilling or self._elider.total_bytes > self.max_bytes

    def _image(self, encoded: str) -> None:
        size = len(encoded) * 3 // 4
        if len(self.images) >= MAX_IMAGES:
            self._left_out.append(f"[image/png of {size} bytes left out: at most {MAX_IMAGES} "
                                  "images per call]")
        elif size > MAX_IMAGE_BYTES:
            self._left_out.append(f"[image/png of {size} bytes left out: larger than "
                                  f"{MAX_IMAGE_BYTES} bytes]")
        else:
            try:
                base64.b64decode(encoded.replace("\n", ""), validate=True)
            except ValueError:
                self._left_out.append("[image/png left out: its data is not valid base64]")
                return
            self.images.append(ImageContent(data=encoded.replace("\n", ""),
                                            mimeType="image/png"))
        self.changed = True

    def snapshot(self) -> Elision:
        self.changed = False
        return self._elider.result()

    @property
    def full_output_path(self) -> str | None:
        return None if self._spill is None else str(self._spill[1])

    async def flush(self) -> None:
        """Write to the spill file what it lacks, once the output is over the limit (the
        first time: create it). In a thread; a failure leaves the output shown without it.
        One at a time: a flush from another task waits for this one, then writes what came
        since (so the file is created once and its chunks are in order).

        On cancellation while it waits for its turn nothing is lost (the next flush writes
        it); a write (or the file's creation) already running in its thread is waited for,
        not abandoned, and ``Cancelled`` comes at the next checkpoint; a chunk whose write had
        not started is dropped from the spill file (the shown output keeps it) and
        ``Cancelled`` propagates."""
        async with self._flushing:
            if not self._spilling or not self._unspilled or self._spill_failed:
                return
            chunk = bytes(self._unspilled)
            self._unspilled.clear()
            try:
                if self._spill is None:
                    self._spill = await trio.to_thread.run_sync(create_spill_file, "omp-eval")
                await trio.to_thread.run_sync(_write_all, self._spill[0], chunk)
            except OSError:
                self._spill_failed = True

    def close(self) -> None:
        if self._spill is not None:
            os.close(self._spill[0])

    def text(self) -> str:
        """The text part of the result: the output or a placeholder, the notes on images left
        out, and the elision notice."""
        shown = self._elider.result()
        body = shown.content.rstrip("\n")
        if not body.strip():
            count = len(self.images)
            body = (f"(displayed {count} image{'s' if count != 1 else ''}; no text output)"
                    if count else "(no output)")
        text = "\n".join([body, *self._left_out])
        notice = elision_notice(shown, self.full_output_path)
        return f"{text}\n\n{notice}" if notice else text

    def details(self, extra: dict[str, Any]) -> dict[str, Any]:
        details = dict(extra)
        shown = self._elider.result()
        if (truncation := shown.details()) is not None:
            details["truncation"] = truncation
        if self.full_output_path is not None:
            details["fullOutputPath"] = self.full_output_path
        return details


def _import_kernel_module() -> None:
    from . import eval_kernel  # noqa: F401 (imported for sys.modules, in a worker thread)


async def _open_kernel(services: trio.Nursery, ctx: ToolContext) -> Kernel:
    """A new kernel in the session's cwd with ``bash``'s environment; raises ToolError when it
    cannot start. The first time, its module is imported in a worker thread, so the event loop
    keeps serving meanwhile. On cancellation the kernel being started is killed."""
    await trio.to_thread.run_sync(_import_kernel_module)
    from .eval_kernel import KernelError, open_kernel

    try:
        return await open_kernel(services, ctx.cwd, shell_environment(ctx.cwd, ctx.environment))
    except KernelError as exc:
        raise ToolError(str(exc)) from None
    except OSError as exc:
        raise ToolError(f"Could not start the Python kernel: {exc}") from None


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[os.write(fd, view):]


@attrs.define(eq=False)
class EvalTool(SpecifiedTool):
    ctx: ToolContext
    _kernel: Kernel | None = None
    _kernels_started: int = 0

    spec = EVAL_SPECS["eval"]

    def __attrs_post_init__(self) -> None:
        self.ctx.on_session_change.append(self._end_kernel)

    async def _end_kernel(self) -> None:
        """The session changed: stop the kernel (its process group killed, its files removed),
        so the next call starts a new one. Not cut short by cancellation (``Kernel.stop``)."""
        kernel, self._kernel = self._kernel, None
        if kernel is not None:
            await kernel.stop()

    async def execute(self, call_id: str, args: dict[str, Any], *,
                      on_update: OnUpdate, steered: trio.Event | None = None) -> ToolResult:
        """Run the cell in the session's kernel (started now if there is none), streaming its
        output; see the module docstring for the results.

        On cancellation (abort) the cell is interrupted, the kernel stopped if it does not
        end, no further update is sent, and ``Cancelled`` propagates.
        """
        if args.get("language") != "py":
            raise ToolError(NO_JS if args.get("language") == "js"
                            else f'Unknown language {args.get("language")!r}: use "py".')
        code = args["code"]
        timeout = cell_timeout(args, self.ctx.eval)
        if args.get("reset") is True and self._kernel is not None:
            kernel, self._kernel = self._kernel, None
            await kernel.stop()
        kernel, replaced = await self._ready_kernel()
        output = CellOutput()
        extra: dict[str, Any] = {"language": "py"}
        if isinstance(args.get("title"), str):
            extra["title"] = args["title"]
        try:
            async with trio.open_nursery() as nursery:
                streaming = trio.CancelScope()
                nursery.start_soon(self._stream, output, on_update, extra, streaming)
                end = await kernel.run_cell(code, output.take, limit=timeout)
                streaming.cancel()
            await output.flush()
        finally:
            output.close()
        return self._result(output, end, kernel, timeout, replaced, extra)

    async def _ready_kernel(self) -> tuple[Kernel, bool]:
        """The live kernel, started now if there is none; and whether it replaces one that
        ended (its names are gone)."""
        kernel = self._kernel
        if kernel is not None and kernel.alive:
            return kernel, False
        services = self.ctx.services
        if services is None:
            raise ToolError("eval: this session cannot keep a kernel (no helper nursery)")
        replaced = kernel is not None
        self._kernel = None
        kernel = await _open_kernel(services, self.ctx)
        self._kernel = kernel
        self._kernels_started += 1
        return kernel, replaced

    async def _stream(self, output: CellOutput, on_update: OnUpdate, extra: dict[str, Any],
                      scope: trio.CancelScope) -> None:
        with scope:
            while True:
                await trio.sleep(UPDATE_INTERVAL)
                if output.changed:
                    shown = output.snapshot()
                    await output.flush()
                    await on_update(ToolResult([TextContent(text=shown.content)],
                                               output.details(extra)))

    def _result(self, output: CellOutput, end: CellEnd, kernel: Kernel, timeout: float | None,
                replaced: bool, extra: dict[str, Any]) -> ToolResult:
        text = output.text()
        if replaced:
            text = f"{KERNEL_LOST}\n\n{text}"
        details = output.details(extra)
        if end == "timeout":
            restarted = "" if kernel.alive else (
                " The kernel did not stop and was restarted: the names defined before are "
                "gone.")
            raise ToolError(f"{text}\n\nCell timed out after {format_seconds(timeout or 0)} "
                            f"seconds.{restarted}", details)
        if end == "died":
            code = kernel.process.returncode
            raise ToolError(f"{text}\n\nThe Python kernel died during the cell (exit code "
                            f"{code}); the next call starts a new one, without the names "
                            "defined before.", details)
        if output.errored:
            raise ToolError(text, details)
        return ToolResult([TextContent(text=text), *output.images], details)
