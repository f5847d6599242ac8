"""Checks of the cancellation property test (``test_cancellation_property``) that only its
scenarios know how to ask (the ids ``p1``, ``b1`` and ``d1``, the server's abort registry), the
host's recording output, and what is left running.

The protocol's rules themselves (``check_runs``, ``check_run_outcomes`` ...) are the package's:
``omp.testing.invariants``, one statement of them for this test and for every host's tests.
Every ``check_*`` function takes the frames in arrival order (plain JSON objects, as
``agent_helpers.to_frame`` makes them) and raises ``AssertionError`` naming the broken rule, with
the frames around the problem (``around``).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import AsyncIterator, Sequence

import msgspec
import trio
from agent_helpers import Frame

from omp.session.aborts import Family
from omp.testing.invariants import fail_at, responses_by_id
from omp.testing.leaks import leftover_tasks as leftover_tasks
from omp.testing.leaks import task_tree as task_tree

# --- the host's side of the wire -----------------------------------------------------------------


class RecordingSendStream(trio.abc.SendStream):
    """The host's output to the server, with every complete line it wrote decoded in ``sent``
    (commands and the host's answers: ``host_tool_result``, ``host_uri_result`` ...)."""

    def __init__(self, inner: trio.abc.SendStream) -> None:
        self.inner = inner
        self.sent: list[Frame] = []
        self._partial = b""
        self._held: bytearray | None = None
        # The client's own lock guards its sends, not the one write of ``together``.
        self._lock = trio.StrictFIFOLock()

    async def send_all(self, data: bytes | bytearray | memoryview) -> None:
        """Record, then send (inside ``together``: keep for its one write); on cancellation the
        data counts as written (memory streams never block: the host's writer is never
        cancelled halfway)."""
        *lines, self._partial = (self._partial + bytes(data)).split(b"\n")
        for line in lines:
            if line:
                decoded = msgspec.json.decode(line)
                assert isinstance(decoded, dict), line
                self.sent.append(decoded)
        if self._held is not None:
            self._held += data
            await trio.lowlevel.checkpoint()
            return
        async with self._lock:
            await self.inner.send_all(data)

    @contextlib.asynccontextmanager
    async def together(self) -> AsyncIterator[None]:
        """What is sent in the block reaches the server in one ``send_all``, at its end (also
        when the block is cancelled: what the host wrote counts as written)."""
        assert self._held is None, "together() does not nest"
        held = self._held = bytearray()
        try:
            yield
        finally:
            self._held = None
            if held:
                # Shielded without a deadline: an unbounded memory stream never blocks.
                with trio.CancelScope(shield=True):
                    async with self._lock:
                        await self.inner.send_all(held)

    async def wait_send_all_might_not_block(self) -> None:
        await self.inner.wait_send_all_might_not_block()

    async def aclose(self) -> None:
        await self.inner.aclose()


# --- what is left running ------------------------------------------------------------------------


def recorded_pids(path: os.PathLike[str] | str) -> list[int]:
    """The pids a shell command appended to ``path`` (``echo $$ >> path``), if it got so far."""
    try:
        with open(path) as file:
            return [int(line) for line in file.read().split()]
    except FileNotFoundError:
        return []

# --- the abort registry ----------------------------------------------------------------------


def check_cut_together(frames: Sequence[Frame], together: tuple[str, str] | None,
                       disruption: str) -> None:
    """A command and the ``abort`` (or ``abort_bash``) written right behind it in one write:
    the command was registered when its line was read, so the abort found it. A prompt's
    run is aborted (its ``prompt_result`` says so), an RPC ``bash`` is answered cancelled."""
    if together is None:
        return
    command_id, _ = together
    if command_id == "p1" and disruption in ("abort", "abort_eof"):
        results = [i for i, f in enumerate(frames)
                   if f["type"] == "prompt_result" and f.get("id") == "p1"]
        for i in results:
            if frames[i]["status"] != "aborted":
                raise fail_at(frames, i, "the prompt written with an abort behind it was not "
                                         "aborted (the run did not adopt the prompt's scope?)")
    if command_id == "b1" and disruption in ("abort", "abort_bash", "abort_eof"):
        for i in responses_by_id(frames).get("b1", []):
            if not (frames[i].get("data") or {}).get("cancelled"):
                raise fail_at(frames, i, f"the RPC bash written with {disruption} behind it was "
                                         "not cancelled (registered after the next line?)")


def check_rpc_bash_cut(frames: Sequence[Frame], *, abort_id: str | None, sent_at: int | None,
                       cut_before: bool) -> None:
    """An ``abort`` or ``abort_bash`` sent while the RPC ``b1`` ran a command that cannot end by
    itself before ``cut_before`` says it could (its own timeout): ``b1`` is answered cancelled,
    not timed out (``abort`` cancels the bash family too)."""
    if abort_id is None or sent_at is None or not cut_before:
        return
    for i in responses_by_id(frames).get("b1", []):
        if i < sent_at:
            return  # answered before the abort was sent
        data = frames[i].get("data") or {}
        if not data.get("cancelled") or data.get("timedOut"):
            raise fail_at(frames, i, f"the RPC bash running when {abort_id!r} was sent was not "
                                     "cancelled by it")


def check_registry(idle: dict[Family, int] | None, final: dict[Family, int] | None) -> None:
    """The abort registry holds nothing once the session is idle (every unit is released by
    the time its end is visible) and nothing once ``serve()`` has returned."""
    assert final == {}, f"the abort registry still holds {final} after serve() returned"
    if idle is not None:
        assert idle == {}, f"the abort registry holds {idle} while the session is idle"

