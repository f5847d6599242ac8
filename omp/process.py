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
``setsid`` — is re-parented to us instead of to init. The block owns a nursery with one task,
the reaper: woken by SIGCHLD (in the main thread; elsewhere a poll every ``REAP_POLL`` seconds),
it reaps every adopted orphan that has exited, so exited orphans do not fill the process table.
It never reaps a process trio waits on: ours are the children this process holds a pidfd of
(trio waits on a pidfd for every ``trio.Process`` until it has the exit status), and while one
of our own children is being started (``open_process_group``: forked, no pidfd yet) the reaper
waits. At the end of the block every adopted orphan still running is ended and reaped.
Elsewhere (no ``prctl``) it does nothing; without pidfds (an old kernel) orphans are reaped
only at the end.

``open_process_group`` is how we start a subprocess: in a new session, so it leads its own
process group, and known to the reaper while it starts.

``private_memory`` is also for a process that serves its own stdio: while it runs the process is
not dumpable (Linux ``PR_SET_DUMPABLE`` 0), so ``/proc/<pid>/environ`` and ``/proc/<pid>/mem`` of
the server are no longer readable by its children, which run as the same user: a command cannot
read the provider keys that its own environment was made without (``omp.subprocess_env``). A
process holding ``CAP_SYS_PTRACE`` (root, usually) still can; nothing short of another user
stops that. It also means no core dump and no debugger attaching without that capability.

``hide_environment_block`` is for the same process, once at its start: the provider keys and
every secret-looking variable are overwritten in the memory ``/proc/<pid>/environ`` shows (the
environment block the kernel copied at ``exec``), so that even a reader with
``CAP_SYS_PTRACE`` (root) finds them gone from it. ``os.environ``, copied from that block when
Python started, keeps them: what needs a key reads it there.

``watch_stop_signals`` turns SIGTERM, SIGHUP and SIGINT into calls of a function (the server
ends its input as at EOF); it is only for a process that serves its own stdio, never for a
server embedded in a host's program.

**Cancellation.** ``kill_process_group`` and the end of ``adopt_orphans`` are made for ``finally``
blocks and for cleanup after a cancellation: they run shielded from the caller's cancellation
under a deadline of their own (``grace + REAP_TIMEOUT``), so an abort cannot cut them short and
they cannot hang a shutdown. When that deadline passes before the leader could be reaped (a
process stuck in the kernel ignores even SIGKILL for a while), ``kill_process_group`` returns
anyway; trio reaps the leader whenever it exits. The reaper stops when the block ends (its
nursery is cancelled), before the orphans still running are ended.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import signal
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from contextvars import ContextVar
from typing import Any, NamedTuple

import trio

from .groups import unwrap

KILL_GRACE = 2.0
"""Default seconds between SIGTERM and SIGKILL to a process group."""
REAP_TIMEOUT = 1.0
"""Seconds, after SIGKILL, to wait for the leader to be reaped."""
STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP, signal.SIGINT)
"""What ``watch_stop_signals`` handles."""
REAP_POLL = 0.25
"""Seconds between two looks for exited orphans when no SIGCHLD can wake the reaper."""
_POLL_INTERVAL = 0.02
_PR_GET_DUMPABLE = 3
_PR_SET_DUMPABLE = 4
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
    session: int

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
        if len(fields) > 3:
            yield _Stat(int(name), fields[0], int(fields[1]), int(fields[2]), int(fields[3]))


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
    if proc.returncode is None:
        # The leader runs: nothing more to know, and looking for the other members reads the
        # stat file of every process on the machine (a millisecond or more, at every poll of
        # the kill's grace period).
        return True
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


@contextlib.contextmanager
def private_memory() -> Iterator[None]:
    """Not dumpable while the block runs (see the module docstring); the previous setting is
    restored afterwards. Elsewhere than Linux nothing happens."""
    prctl = _prctl()
    previous = prctl(_PR_GET_DUMPABLE, 0, 0, 0, 0) if prctl is not None else -1
    if prctl is None or previous < 0 or prctl(_PR_SET_DUMPABLE, 0, 0, 0, 0) != 0:
        yield
        return
    try:
        yield
    finally:
        prctl(_PR_SET_DUMPABLE, previous, 0, 0, 0)


def hide_environment_block(secret: Callable[[str], bool]) -> int:
    """Overwrite with NUL bytes every ``NAME=value`` of this process's initial environment
    block whose name ``secret`` picks; returns how many there were. ``/proc/self/environ`` (and
    ``/proc/<pid>/environ`` for whoever may read it) then shows the others only. Elsewhere than
    Linux, or when the block cannot be read or written, nothing changes (0).

    ``os.environ`` is untouched (Python copied the block when it started). libc's ``environ``
    (what ``getenv`` in C and a child started without ``env=`` see) points into the block, so
    each hidden variable still set there is set again first: ``setenv`` copies it to the heap,
    and nothing is left pointing at the bytes overwritten. The other entries stay where they
    are, byte for byte, so a pointer a library kept into them stays good.

    In place, not by starting again: the alternative, re-executing once with a clean
    environment and handing the values over an inherited pipe, costs at least one more
    interpreter start before ``ready`` (40 ms on our loaded 2-core machine) against 0.25 ms
    for this (``bench/bench_rpc.py --env-block``), and a pipe protocol to get right.
    """
    try:
        with open("/proc/self/stat", "rb") as f:
            stat = f.read()
        # After "pid (comm) ": field 3 is index 0, so env_start / env_end (50, 51) are 47, 48.
        fields = stat[stat.rfind(b")") + 2:].split()
        start, end = int(fields[47]), int(fields[48])
        with open("/proc/self/mem", "r+b", buffering=0) as mem:
            mem.seek(start)
            block = bytearray(mem.read(end - start))
            hidden = 0
            offset = 0
            for entry in bytes(block).split(b"\0"):
                name = entry.partition(b"=")[0]
                if entry and secret(os.fsdecode(name)):
                    if (value := os.environb.get(name)) is not None:
                        os.putenv(name, value)  # libc's copy moves off the block
                    block[offset:offset + len(entry)] = bytes(len(entry))
                    hidden += 1
                offset += len(entry) + 1
            if hidden:
                mem.seek(start)
                mem.write(block)
    except (OSError, IndexError, ValueError):
        return 0
    return hidden


def live_children() -> frozenset[int]:
    """This process's child processes that have not exited (Linux ``/proc``; elsewhere none
    are seen)."""
    me = os.getpid()
    return frozenset(p.pid for p in _processes() or () if p.ppid == me and not p.dead)


def _children(exclude: frozenset[int]) -> list[_Stat]:
    me = os.getpid()
    return [p for p in _processes() or () if p.ppid == me and p.pid not in exclude]


def _children_at_start() -> frozenset[int]:
    """The children this process has when it starts serving: the kernel's list of each
    thread's children (``/proc/self/task/*/children``), one small file instead of every
    process's ``stat`` (a busy machine has thousands); the whole scan where the kernel has no
    such list. (That list may miss a child being reparented meanwhile, which at the start
    only an orphan of the process that exec'd us could be: the scans at the end stay whole.)"""
    try:
        tasks = os.listdir("/proc/self/task")
        with open(f"/proc/self/task/{os.getpid()}/children", "rb") as f:
            pids = {int(pid) for pid in f.read().split()}
    except (OSError, ValueError):
        return frozenset(p.pid for p in _children(frozenset()))
    for tid in tasks:
        with contextlib.suppress(OSError, ValueError), \
                open(f"/proc/self/task/{tid}/children", "rb") as f:
            pids.update(int(pid) for pid in f.read().split())
    return frozenset(pids)


def _signal_orphan(p: _Stat, sig: int) -> None:
    # An orphan that leads its group (``setsid x``) takes its group with it; else only itself.
    with contextlib.suppress(ProcessLookupError, PermissionError):
        if p.pgrp == p.pid:
            os.killpg(p.pid, sig)
        else:
            os.kill(p.pid, sig)


async def end_orphans(exclude: frozenset[int] = frozenset(), grace: float = KILL_GRACE, *,
                      since: float | None = None, signalled: set[int] | None = None) -> None:
    """End and reap every child of ours (other than those in ``exclude``): SIGTERM (and
    SIGCONT), up to ``grace`` seconds, then SIGKILL. Children of a dying orphan come back to us
    (subreaper) and are ended the same way. ``since``: the grace began then (trio time) for
    the pids in ``signalled``, which were sent SIGTERM already (``end_orphans_soon``).

    Only for the end of ``adopt_orphans``: by then every process we started ourselves has been
    waited for. Shielded from the caller's cancellation, bounded by ``grace + REAP_TIMEOUT``.
    """
    with trio.move_on_after(grace + REAP_TIMEOUT, shield=True):
        kill_at = (trio.current_time() if since is None else since) + grace
        signalled = set() if signalled is None else signalled
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


def end_orphans_soon() -> None:
    """The server is shutting down: SIGTERM (and SIGCONT) the orphans running now, so that their
    grace period runs alongside the one of the commands being cancelled, not after it (a
    command and an escaped child that both ignore SIGTERM: one grace, about two seconds, not
    two). The end of the ``adopt_orphans`` block then SIGKILLs what is left once that grace has
    passed. Outside such a block, or without pidfds, it does nothing. Our own children (trio's,
    ended by their own scopes) and processes of our own session are left alone."""
    orphanage = _ORPHANAGE.get()
    if orphanage is None or orphanage.term_at is not None:
        return
    ours = _pidfd_pids()
    if ours is None:
        return
    orphanage.term_at = trio.current_time()
    session = os.getsid(0)
    for p in _children(orphanage.before):
        if p.pid in ours or p.dead or p.session == session:
            continue
        orphanage.signalled.add(p.pid)
        _signal_orphan(p, signal.SIGTERM)
        _signal_orphan(p, signal.SIGCONT)


class _Orphanage:
    """What the reaper of one ``adopt_orphans`` block knows besides /proc: the children it
    leaves alone (those we had before the block) and how many of our own are being started."""

    __slots__ = ("before", "signalled", "starting", "term_at")

    def __init__(self, before: frozenset[int]) -> None:
        self.before = before
        self.starting = 0
        self.term_at: float | None = None
        """When ``end_orphans_soon`` sent SIGTERM (trio time), if it did."""
        self.signalled: set[int] = set()


_ORPHANAGE: ContextVar[_Orphanage | None] = ContextVar("omp_orphanage", default=None)
"""The reaper of the ``adopt_orphans`` block the current task runs in (a task inherits it from
the task that started it), if any."""


async def open_process_group(argv: Sequence[str], **options: Any) -> trio.Process:
    """``trio.lowlevel.open_process(argv, **options)`` in a new session, so the child leads its
    own process group (``kill_process_group`` ends it with whatever it started). Inside
    ``adopt_orphans`` the reaper reaps nothing while the child is being started, so a child
    that exits at once still has its exit status for its ``trio.Process``. Raises ``OSError``
    as ``open_process`` does.

    On cancellation, as ``open_process``: either nothing was started and ``Cancelled``
    propagates, or the start is not interrupted (the fork runs in a worker thread) and the
    process is returned.
    """
    orphanage = _ORPHANAGE.get()
    if orphanage is None:
        return await trio.lowlevel.open_process(argv, start_new_session=True, **options)
    # From the fork until trio holds the child's pidfd (when open_process returns), nothing
    # tells the reaper that this child is ours.
    orphanage.starting += 1
    try:
        return await trio.lowlevel.open_process(argv, start_new_session=True, **options)
    finally:
        orphanage.starting -= 1


def _pidfd_pids() -> set[int] | None:
    """The processes this process holds a pidfd of: trio holds one for every ``trio.Process``
    until it has read its exit status. None when ``/proc/self/fd`` cannot be read."""
    try:
        names = os.listdir("/proc/self/fd")
    except OSError:
        return None
    pids: set[int] = set()
    for name in names:
        try:
            if os.readlink(f"/proc/self/fd/{name}") != "anon_inode:[pidfd]":
                continue
            with open(f"/proc/self/fdinfo/{name}", "rb") as f:
                info = f.read()
        except OSError:  # closed meanwhile
            continue
        for line in info.splitlines():
            if line.startswith(b"Pid:"):
                pids.add(int(line.split()[1]))
    return pids


def _pidfds_work() -> bool:
    """Whether trio waits on pidfds here (Linux 5.3 and later) and /proc shows them: only then
    can the reaper tell trio's children from orphans."""
    try:
        fd = os.pidfd_open(os.getpid())
    except (AttributeError, OSError):
        return False
    try:
        return os.getpid() in (_pidfd_pids() or ())
    finally:
        os.close(fd)


def _exited_child() -> bool:
    """Whether a child of ours has exited and waits to be reaped (peeked at, not reaped)."""
    try:
        return os.waitid(os.P_ALL, 0, os.WEXITED | os.WNOHANG | os.WNOWAIT) is not None
    except ChildProcessError:  # no child at all
        return False


def _reap_exited_orphans(orphanage: _Orphanage) -> bool:
    """Reap every adopted orphan that has exited. False when they were left for later because
    one of our own children is being started."""
    if not _exited_child():
        return True
    if orphanage.starting:
        return False
    ours = _pidfd_pids()
    if ours is None:
        return True
    me, session = os.getpid(), os.getsid(0)
    for p in _processes() or ():
        # A child in our own session was not started by us (ours lead sessions of their own)
        # nor descends from one of ours: other code in this process started it (say,
        # subprocess.run in a thread) and may wait for it without a pidfd. Left to the end.
        if (p.ppid == me and p.dead and p.pid not in ours and p.session != session
                and p.pid not in orphanage.before):
            _reap(p.pid)
    return True


async def _reap_orphans(orphanage: _Orphanage, *,
                        task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
    """Reap exited orphans until cancelled: at every SIGCHLD (main thread only: signal
    handlers live there) and at least every ``REAP_POLL`` seconds."""
    with contextlib.ExitStack() as stack:
        signals = (stack.enter_context(trio.open_signal_receiver(signal.SIGCHLD))
                   if can_watch_signals() else None)
        task_status.started()
        while True:
            done = _reap_exited_orphans(orphanage)
            with trio.move_on_after(REAP_POLL if done else _POLL_INTERVAL):
                if signals is None:
                    await trio.sleep_forever()
                else:
                    await anext(signals)


@contextlib.asynccontextmanager
async def adopt_orphans() -> AsyncIterator[None]:
    """Be a child subreaper while the block runs, reaping the orphans that come to us as they
    exit; at its end, end and reap those still running.

    Children we already had when it began are left alone. Without ``PR_SET_CHILD_SUBREAPER``
    (not Linux) it does nothing and says nothing. The reaper is a task of a nursery the block
    owns; the block's own exception leaves as itself (``omp.groups``). The end is shielded and
    bounded (see ``end_orphans``), so it also runs when the block is cancelled.
    """
    previous = _set_subreaper(True)
    if previous is None:
        yield
        return
    orphanage = _Orphanage(_children_at_start())
    try:
        if not _pidfds_work():  # no way to tell trio's children from orphans: only the end
            yield
            return
        token = _ORPHANAGE.set(orphanage)
        try:
            with unwrap():
                async with trio.open_nursery() as nursery:
                    await nursery.start(_reap_orphans, orphanage)
                    try:
                        yield
                    finally:
                        nursery.cancel_scope.cancel()  # the reaper runs until cancelled
        finally:
            _ORPHANAGE.reset(token)
    finally:
        try:
            await end_orphans(orphanage.before, since=orphanage.term_at,
                              signalled=orphanage.signalled)
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
