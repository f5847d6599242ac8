"""What a test left running: trio tasks, worker threads, child processes, open files.

``Resources.now()`` takes stock inside a ``trio.run``; ``Resources.left_since(before)`` (after a
bounded wait for things already ending to end) raises ``AssertionError`` listing what was
started since ``before`` and is still there. The pytest fixtures of ``omp.testing`` take stock
when they start and check when they end, so a leak fails the test that caused it.

What counts: a task of this ``trio.run`` that did not exist before and is not the caller or one
of its ancestors (trio's own tasks and pytest-trio's fixture tasks, whose names begin with
``<``, are not counted); a worker thread borrowed from trio's default limiter and not given
back (a ``to_thread`` call abandoned on cancellation, still running); a live child process of
this process that was not there before (a zombie holds nothing and is not counted); a file
descriptor open now that was not before (Linux ``/proc/self/fd``; elsewhere not checked).
"""

from __future__ import annotations

import os
import time
from typing import Any

import attrs
import trio

from ..process import live_children

__all__ = ["Resources", "leftover_tasks", "task_tree"]

SETTLE_SECONDS = 5.0
"""How long ``left_since`` waits for what is already ending (a connection task noticing its
peer closed, a killed process being reaped) before it calls it a leak."""
_POLL = 0.01


def _ancestry() -> set[trio.lowlevel.Task]:
    keep: set[trio.lowlevel.Task] = set()
    task: trio.lowlevel.Task | None = trio.lowlevel.current_task()
    while task is not None:
        keep.add(task)
        nursery = task.parent_nursery
        task = nursery.parent_task if nursery is not None else None
    return keep


def _all_tasks() -> list[trio.lowlevel.Task]:
    found: list[trio.lowlevel.Task] = []

    def walk(task: trio.lowlevel.Task) -> None:
        found.append(task)
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child)

    root = trio.lowlevel.current_root_task()
    if root is not None:
        walk(root)
    return found


def leftover_tasks() -> list[str]:
    """Names of the tasks of this ``trio.run`` other than the caller, its ancestors and trio's
    own: what would still be running when the caller returns."""
    keep = _ancestry()
    return [t.name for t in _all_tasks() if t not in keep and not t.name.startswith("<")]


def task_tree() -> str:
    """Every task of this ``trio.run``, indented under its parent, with where it waits (the
    innermost frames of its coroutine chain): what a hung test prints."""
    lines: list[str] = []

    def where(task: trio.lowlevel.Task) -> str:
        frames = []
        coro: Any = task.coro
        while coro is not None:
            frame = getattr(coro, "cr_frame", None) or getattr(coro, "gi_frame", None)
            if frame is not None:
                frames.append(f"{os.path.basename(frame.f_code.co_filename)}:{frame.f_lineno}")
            coro = getattr(coro, "cr_await", None) or getattr(coro, "gi_yieldfrom", None)
        ours = [f for f in frames if not f.startswith("_")]  # trio's modules start with _
        return " > ".join(ours[-3:] + frames[-1:])

    def walk(task: trio.lowlevel.Task, depth: int) -> None:
        lines.append(f"{'  ' * depth}{task.name}  [{where(task)}]")
        for nursery in task.child_nurseries:
            for child in nursery.child_tasks:
                walk(child, depth + 1)

    root = trio.lowlevel.current_root_task()
    if root is not None:
        walk(root, 0)
    return "\n".join(lines)


def _open_fds() -> dict[int, str]:
    """Open file descriptors and what each one is (``/proc/self/fd``; elsewhere none)."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return {}
    found: dict[int, str] = {}
    for name in names:
        try:
            found[int(name)] = os.readlink(f"/proc/self/fd/{name}")
        except OSError:  # the listing's own descriptor, or closed meanwhile
            continue
    return found


def _borrowed_threads() -> int:
    return int(trio.to_thread.current_default_thread_limiter().statistics().borrowed_tokens)


@attrs.frozen
class Resources:
    """What exists at one moment of a ``trio.run``: tasks, borrowed worker threads, live child
    processes, open file descriptors."""

    tasks: frozenset[trio.lowlevel.Task]
    threads: int
    children: frozenset[int]
    fds: dict[int, str]

    @classmethod
    def now(cls) -> Resources:
        """Take stock (inside ``trio.run``)."""
        return cls(frozenset(_all_tasks()), _borrowed_threads(), live_children(), _open_fds())

    def _new_since(self, before: Resources) -> list[str]:
        keep = _ancestry()
        found = [f"task {t.name!r}" for t in self.tasks - before.tasks
                 if t not in keep and not t.name.startswith("<")]
        if self.threads > before.threads:
            found.append(f"{self.threads - before.threads} worker thread(s) still running")
        found += [f"child process {pid}" for pid in sorted(self.children - before.children)]
        found += [f"open file descriptor {fd} ({self.fds[fd]})"
                  for fd in sorted(set(self.fds) - set(before.fds))
                  if before.fds.get(fd) != self.fds[fd]]
        return found

    @staticmethod
    async def left_since(before: Resources, what: str,
                         settle: float = SETTLE_SECONDS) -> None:
        """Raise ``AssertionError`` naming ``what`` and everything started since ``before``
        that is still there after at most ``settle`` seconds of real time spent waiting for it
        to end (a connection task noticing its peer left, a killed process being reaped).
        Cancellation stops the waiting and propagates."""
        # Real time (time.monotonic): on a MockClock trio's time would leap through the wait
        # without giving a process the time to be reaped.
        give_up = time.monotonic() + settle
        while True:
            found = Resources.now()._new_since(before)
            if not found:
                return
            if time.monotonic() >= give_up:
                tasks = any(f.startswith("task") for f in found)
                raise AssertionError(f"{what} left behind: " + "; ".join(found)
                                     + (f"\n{task_tree()}" if tasks else ""))
            await trio.sleep(_POLL)
