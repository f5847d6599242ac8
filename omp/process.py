"""Our own process's lifecycle: ending a child's whole process group, orphans, stop signals.

Our subprocesses (shell commands, ``rg``, an ``omp --mode rpc`` spawned by ``RpcClient``) start in
a new session, so each leads its own process group, and whatever it starts stays in that group
unless it leaves on purpose (``setsid``).

``kill_process_group`` ends such a group: SIGTERM (and SIGCONT, so that a stopped member can act
on it) to the group, up to ``grace`` seconds for every member to exit, SIGKILL to whatever is left,
then the leader is waited for (reaped), and so are members that were re-parented to us (see
``adopt_orphans``). An already empty group costs nothing and is not signalled.

``adopt_orphans`` is for a process that serves its own stdio (``omp --mode rpc``, ``omp -p``):
for its duration the process is a child subreaper (Linux ``PR_SET_CHILD_SUBREAPER``), so a
descendant whose parent exits — a shell's background job, or a process that left its group with
``setsid`` — is re-parented to us instead of to init. At the end of the block every such process
still running is ended and reaped. Elsewhere (no ``prctl``) it does nothing.

``watch_stop_signals`` turns SIGTERM, SIGHUP and SIGINT into calls of a function (the server
ends its input as at EOF); it is only for a process that serves its own stdio, never for a
server embedded in a host's program.

**Cancellation.** ``kill_process_group`` and the end of ``adopt_orphans`` are made for ``finally``
blocks and for cleanup after a cancellation: they run shielded from the caller's cancellation
under a deadline of their own (``grace + REAP_TIMEOUT``), so an abort cannot cut them short and
they cannot hang a shutdown. When that deadline passes before the leader could be reaped (a
process stuck in the kernel ignores even SIGKILL for a while), ``kill_process_group`` returns
anyway; trio reaps the leader whenever it exits.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from typing import NamedTuple

import trio

KILL_GRACE = 2.0
"""Default seconds between SIGTERM and SIGKILL to a process group."""
REAP_TIMEOUT = 1.0
"""Seconds, after SIGKILL, to wait for the leader to be reaped."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""What ``watch_stop_signals`` handles."""
_POLL_INTERVAL = 0.02
_PR_SET_CHILD_SUBREAPER = 36
_PR_GET_CHILD_SUBREAPER = 37


def signal_group(pgid: int, sig: int) -> None:
    """Send ``sig`` to the process group ``pgid``; nothing happens when the group is gone."""
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, sig)


class _Stat(NamedTuple):
    pid: int
    state: bytes
    ppid: int
    pgrp: int

    @property
    def dead(self) -> bool:
        """A zombie (or dying) process runs nothing and holds nothing."""
        return self.state in (b"Z", b"X")


def _processes() -> Iterator[_Stat] | None:
    """Every process in /proc; None without procfs."""
    try:
        names = os.listdir("/proc")
    except OSError:
        return None
    return _stats(names)


def _stats(names: list[str]) -> Iterator[_Stat]:
    for name in names:
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as f:
                stat = f.read()
        except OSError:
            continue
        # "pid (comm) state ppid pgrp ...": comm may hold anything, so split after its ")"
        fields = stat[stat.rfind(b")") + 2:].split()
        if len(fields) > 2:
            yield _Stat(int(name), fields[0], int(fields[1]), int(fields[2]))


def _has_live_member(pgid: int) -> bool:
    """Whether a process other than a zombie is in the group. Orphaned members are reaped by
    init, which some containers' init never does, so "the group exists" is not enough."""
    processes = _processes()
    if processes is None:  # no procfs: zombies count as alive, the grace period runs out instead
        return True
    return any(p.pgrp == pgid and not p.dead for p in processes)


def _reap(pid: int) -> None:
    with contextlib.suppress(ChildProcessError):
        os.waitpid(pid, os.WNOHANG)


def _reap_adopted_members(pgid: int) -> None:
    """Reap the dead members of group ``pgid`` that were re-parented to us (we are a subreaper).

    Never the leader: that is the ``trio.Process`` we started, whose owner waits for it (reaping
    it here would lose its exit status). Every process we start directly leads its own group,
    so a member that is not the leader and is our child can only be an adopted orphan.
    """
    me = os.getpid()
    for p in _processes() or ():
        if p.ppid == me and p.pgrp == pgid and p.pid != pgid and p.dead:
            _reap(p.pid)


def group_alive(proc: trio.Process) -> bool:
    """Whether anything of the group led by ``proc`` still runs (``proc`` itself included)."""
    proc.poll()  # reap the leader if it is gone, so it does not count as a live member
    try:
        os.killpg(proc.pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # a member changed credentials; it exists
        return True
    return _has_live_member(proc.pid)


async def kill_process_group(proc: trio.Process, grace: float = KILL_GRACE) -> None:
    """SIGTERM the group led by ``proc``, give it ``grace`` seconds, SIGKILL what is left, and
    wait for ``proc`` (and reap members re-parented to us). Returns at once when the group is
    already empty.

    Not interrupted by the caller's cancellation: shielded, and bounded by its own deadline of
    ``grace + REAP_TIMEOUT`` seconds (see the module docstring).
    """
    with trio.move_on_after(grace + REAP_TIMEOUT, shield=True):
        if group_alive(proc):
            signal_group(proc.pid, signal.SIGTERM)
            signal_group(proc.pid, signal.SIGCONT)
            with trio.move_on_after(grace):
                # Nothing signals "the group is empty" (members are not our children): poll.
                while group_alive(proc):  # noqa: ASYNC110
                    await trio.sleep(_POLL_INTERVAL)
            if group_alive(proc):
                signal_group(proc.pid, signal.SIGKILL)
                if proc.returncode is None:  # a leader that left its own group
                    with contextlib.suppress(ProcessLookupError):
                        proc.kill()
                # SIGKILL lands asynchronously: a member may still run for a moment after
                # kill() returned. The caller is promised an empty group, so wait for it
                # (within the scope's deadline).
                while group_alive(proc):  # noqa: ASYNC110
                    await trio.sleep(_POLL_INTERVAL)
        _reap_adopted_members(proc.pid)
        await proc.wait()


# --- orphans ---------------------------------------------------------------------------------


def _prctl() -> Callable[..., int] | None:
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        function: Callable[..., int] = libc.prctl
    except (OSError, AttributeError):  # not Linux (or no libc to ask): no subreaper
        return None
    return function


def _set_subreaper(on: bool) -> bool | None:
    """Make us a child subreaper (or stop being one); returns the previous setting, or None
    when the system has no such thing (nothing was changed)."""
    prctl = _prctl()
    if prctl is None:
        return None
    previous = ctypes.c_int(0)
    if prctl(_PR_GET_CHILD_SUBREAPER, ctypes.byref(previous), 0, 0, 0) != 0:
        return None
    if prctl(_PR_SET_CHILD_SUBREAPER, int(on), 0, 0, 0) != 0:
        return None
    return bool(previous.value)


def _children(exclude: frozenset[int]) -> list[_Stat]:
    me = os.getpid()
    return [p for p in _processes() or () if p.ppid == me and p.pid not in exclude]


def _signal_orphan(p: _Stat, sig: int) -> None:
    # An orphan that leads its group (``setsid x``) takes its group with it; else only itself.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if p.pgrp == p.pid:
            os.killpg(p.pid, sig)
        else:
            os.kill(p.pid, sig)


async def end_orphans(exclude: frozenset[int] = frozenset(), grace: float = KILL_GRACE) -> None:
    """End and reap every child of ours (other than those in ``exclude``): SIGTERM (and
    SIGCONT), up to ``grace`` seconds, then SIGKILL. Children of a dying orphan come back to us
    (subreaper) and are ended the same way.

    Only for the end of ``adopt_orphans``: by then every process we started ourselves has been
    waited for. Shielded from the caller's cancellation, bounded by ``grace + REAP_TIMEOUT``.
    """
    with trio.move_on_after(grace + REAP_TIMEOUT, shield=True):
        kill_at = trio.current_time() + grace
        signalled: set[int] = set()
        while children := _children(exclude):
            for p in children:
                if p.dead:
                    _reap(p.pid)
                elif trio.current_time() >= kill_at:
                    _signal_orphan(p, signal.SIGKILL)
                elif p.pid not in signalled:
                    signalled.add(p.pid)
                    _signal_orphan(p, signal.SIGTERM)
                    _signal_orphan(p, signal.SIGCONT)
            await trio.sleep(_POLL_INTERVAL)


@contextlib.asynccontextmanager
async def adopt_orphans() -> AsyncIterator[None]:
    """Be a child subreaper while the block runs; at its end, end the orphans that came to us.

    Children we already had when it began are left alone. Without ``PR_SET_CHILD_SUBREAPER``
    (not Linux) it does nothing and says nothing. The end is shielded and bounded (see
    ``end_orphans``), so it also runs when the block is cancelled.
    """
    previous = _set_subreaper(True)
    if previous is None:
        yield
        return
    before = frozenset(p.pid for p in _children(frozenset()))
    try:
        yield
    finally:
        try:
            await end_orphans(before)
        finally:
            _set_subreaper(previous)


# --- stop signals ----------------------------------------------------------------------------


def can_watch_signals() -> bool:
    """Signal handlers can only be installed from the main thread."""
    return threading.current_thread() is threading.main_thread()


async def watch_stop_signals(on_signal: Callable[[int], None], *,
                             task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED
                             ) -> None:
    """Call ``on_signal(signum)`` for every SIGTERM, SIGHUP and SIGINT until cancelled.

    Started with ``nursery.start``: once started, the signals no longer have their default
    effect (nor trio's ``KeyboardInterrupt``); when it is cancelled, the previous handlers are
    back. Main thread only (``can_watch_signals``).
    """
    with trio.open_signal_receiver(*STOP_SIGNALS) as signals:
        task_status.started()
        async for signum in signals:
            on_signal(signum)
