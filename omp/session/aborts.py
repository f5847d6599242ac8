"""The abort registry: every piece of work a host can abort, by family, in one place.

Rules (docs/internals.md#the-abort-registry):

* Work is registered **when it is accepted**, before the reader reads the next line: the RPC
  reader creates the ``trio.CancelScope`` of a command it hands to a lane or a task and
  registers it here first (``hold``); a run, a retry backoff or a manual compaction registers
  the scope it is given or makes, synchronously, in the call that starts it. So an ``abort``
  written in the same ``send_all`` as the work it cancels always finds that work: a scope that
  is cancelled before its task enters it is entered already cancelled.
* Families: ``run`` (a prompt's run, from the moment the prompt is accepted), ``retry`` (the
  backoff before a retried model call), ``maintenance`` (manual ``compact`` / ``handoff``),
  ``bash`` (RPC ``bash``), ``login``, ``command`` (any other command in flight, which only
  shutdown cancels). ``abort`` cancels ``ABORT``; ``abort_bash`` cancels ``bash``;
  ``abort_retry`` cancels ``retry``; shutdown cancels every family.
* A unit may be held by more than one owner at a time (the serial lane holds a prompt's scope
  while its handler runs, the run holds the same scope until its terminal frames are out); it
  leaves the registry when the last holder releases it.
* A unit may name what a canceller waits for (``done``): ``abort`` answers only once the
  aborted run has written its ``agent_end`` (docs/design/protocol.md#abort).

The registry only cancels; what a cancelled unit reports (an aborted message, a cancelled
``BashResult``, "Login cancelled") is its owner's business, translated at its scope boundary.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Literal

import msgspec
import trio

Family = Literal["run", "retry", "maintenance", "bash", "login", "command"]
ABORT: tuple[Family, ...] = ("run", "retry", "maintenance", "bash", "login")
"""What ``abort`` cancels (it includes ``abort_bash``, docs/design/protocol.md#abort_bash)."""
EVERY: tuple[Family, ...] = ("run", "retry", "maintenance", "bash", "login", "command")


class _Unit(msgspec.Struct, eq=False):
    family: Family
    holders: int = 0
    done: trio.Event | None = None


class AbortRegistry(msgspec.Struct, eq=False):
    """The abortable work of one ``serve()`` (or of one subagent's session)."""

    _units: dict[trio.CancelScope, _Unit] = msgspec.field(default_factory=dict)

    def hold(self, family: Family, scope: trio.CancelScope | None = None, *,
             done: trio.Event | None = None) -> trio.CancelScope:
        """Register ``scope`` (a new one when None) under ``family`` for one more holder;
        ``done`` is what a canceller waits for. Returns the scope. Each ``hold`` is paired
        with one ``release``."""
        if scope is None:
            scope = trio.CancelScope()
        unit = self._units.get(scope)
        if unit is None:
            unit = self._units[scope] = _Unit(family)
        unit.family = family
        unit.holders += 1
        if done is not None:
            unit.done = done
        return scope

    def release(self, scope: trio.CancelScope) -> None:
        """One holder is finished with ``scope``; the last one takes it out of the registry."""
        unit = self._units.get(scope)
        if unit is not None:
            unit.holders -= 1
            if unit.holders <= 0:
                del self._units[scope]

    @contextlib.contextmanager
    def holding(self, family: Family, scope: trio.CancelScope | None = None
                ) -> Iterator[trio.CancelScope]:
        """``hold`` for the ``with`` block, entering the scope: the block is cancelled when the
        family is."""
        scope = self.hold(family, scope)
        try:
            with scope:
                yield scope
        finally:
            self.release(scope)

    def cancel(self, *families: Family) -> list[trio.Event]:
        """Cancel every unit of ``families``; returns what the cancelled units said to wait
        for (the runs' ``done``), for a canceller that answers once they are over."""
        waits = []
        for scope, unit in list(self._units.items()):
            if unit.family in families:
                scope.cancel()
                if unit.done is not None and not unit.done.is_set():
                    waits.append(unit.done)
        return waits

    def live(self, family: Family) -> int:
        """How many units of ``family`` are registered."""
        return sum(1 for unit in self._units.values() if unit.family == family)

    def in_flight(self) -> dict[Family, int]:
        """How many units of each family are registered (families with none left out): empty
        whenever the server is idle, and once ``serve()`` has returned."""
        counts: dict[Family, int] = {}
        for unit in self._units.values():
            counts[unit.family] = counts.get(unit.family, 0) + 1
        return counts
