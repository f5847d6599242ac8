"""What the tests read of other processes in Linux ``/proc``: the one parser of ``stat`` (and of
``status``, ``cmdline``, ``comm``, ``fd``) and the questions the tests ask of them (is a process
alive, its children, process groups, sessions, zombies, a process that is dying, waiting for
one to be gone, memory and CPU use).

``stat``'s second field is the command name in parentheses, which may itself hold spaces and
parentheses, so the fields after it are split from the last ``)``.

Live means neither ``Z`` (a zombie: exited, not reaped yet) nor ``X`` (dead: being reaped), the
same everywhere here: a zombie runs nothing and holds nothing but its process slot, so a test
that wants a process ended counts it as gone. (When a shell dies first its jobs are re-parented
to PID 1, which in a container is often not a real init and never reaps them: a killed job can
stay a zombie indefinitely.)
"""

from __future__ import annotations

import os
import select
from collections.abc import Iterator
from typing import NamedTuple

PF_EXITING = 0x4
"""``flags`` bit the kernel sets once a process has begun to exit (``include/linux/sched.h``)."""
SIGKILL_BIT = 1 << 8
"""SIGKILL (9) in the pending-signal masks of ``/proc/<pid>/status``."""
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")
"""The unit of ``utime`` and ``stime``, per second."""


class Stat(NamedTuple):
    """The fields of ``/proc/<pid>/stat`` the tests use."""

    pid: int
    state: str
    """``R``, ``S``, ``D``, ``T``, ``Z`` (zombie), ``X`` (dead) ..."""
    ppid: int
    pgrp: int
    session: int
    flags: int
    utime: int
    """CPU time spent in user mode, in clock ticks (``CLOCK_TICKS`` a second)."""
    stime: int
    """CPU time spent in the kernel, in clock ticks."""

    @property
    def live(self) -> bool:
        """Running or able to run: neither a zombie nor dead."""
        return self.state not in ("Z", "X")


def stat(pid: int | str) -> Stat | None:
    """``/proc/<pid>/stat``, or None when there is no such process (any more)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as file:
            text = file.read()
    except OSError:
        return None
    fields = text.rsplit(b")", 1)[1].split()
    return Stat(int(pid), fields[0].decode(), int(fields[1]), int(fields[2]), int(fields[3]),
                int(fields[6]), int(fields[11]), int(fields[12]))


def processes() -> Iterator[Stat]:
    """Every process there is now (one that ends during the walk is left out)."""
    for entry in os.listdir("/proc"):
        if entry.isdigit() and (found := stat(entry)) is not None:
            yield found


def alive(pid: int) -> bool:
    """Whether ``pid`` exists and is live (a zombie or dead process counts as gone)."""
    found = stat(pid)
    return found is not None and found.live


def children(pid: int) -> list[int]:
    """Live processes whose parent is ``pid``."""
    return [p.pid for p in processes() if p.ppid == pid and p.live]


def zombie_children(pid: int) -> list[int]:
    """Zombies whose parent is ``pid``: exited and not reaped (each holds a process slot)."""
    return [p.pid for p in processes() if p.ppid == pid and p.state == "Z"]


def group_members(pgid: int) -> list[int]:
    """Live processes in process group ``pgid``."""
    return [p.pid for p in processes() if p.pgrp == pgid and p.live]


def session_members(sid: int) -> list[int]:
    """Live processes in session ``sid``."""
    return [p.pid for p in processes() if p.session == sid and p.live]


def status_field(pid: int, name: str) -> str | None:
    """The value of ``name:`` in ``/proc/<pid>/status``, or None when it has none or is gone."""
    try:
        with open(f"/proc/{pid}/status", "rb") as file:
            lines = file.read().decode().splitlines()
    except OSError:
        return None
    for line in lines:
        key, _, value = line.partition(":")
        if key == name:
            return value.strip()
    return None


def dying(pid: int) -> bool:
    """Whether ``pid`` has been sent SIGKILL or has begun to exit, and is not dead yet: only
    the kernel's own pace, never anything of ours, decides when it is gone."""
    found = stat(pid)
    if found is None or not found.live:
        return False
    if found.flags & PF_EXITING:
        return True
    return any((mask := status_field(pid, name)) is not None and int(mask, 16) & SIGKILL_BIT
               for name in ("SigPnd", "ShdPnd"))


def wait_gone(pid: int, timeout: float) -> bool:
    """Wait up to ``timeout`` seconds for ``pid`` to exit (any process, not only a child: a
    pidfd becomes readable when its process has exited); True once it is gone."""
    try:
        pidfd = os.pidfd_open(pid)
    except ProcessLookupError:
        return True
    try:
        poller = select.poll()
        poller.register(pidfd, select.POLLIN)
        return bool(poller.poll(int(timeout * 1000))) or not alive(pid)
    finally:
        os.close(pidfd)


def runqueue_waits(pid: int) -> dict[int, float] | None:
    """Per thread of ``pid`` (by native id), the seconds it has spent runnable but waiting for
    a CPU (``/proc/<pid>/task/*/schedstat``, second field); None where the kernel does not
    say."""
    waits: dict[int, float] = {}
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            try:
                with open(f"/proc/{pid}/task/{tid}/schedstat", "rb") as file:
                    waits[int(tid)] = int(file.read().split()[1]) / 1e9
            except FileNotFoundError:
                continue  # that thread just ended
    except (OSError, ValueError, IndexError):
        return None
    return waits


def cpu_seconds(pid: int) -> float:
    """The CPU time ``pid`` has used so far (user + kernel), in seconds."""
    found = stat(pid)
    if found is None:
        raise ProcessLookupError(pid)
    return (found.utime + found.stime) / CLOCK_TICKS


def peak_rss_mb(pid: int) -> float:
    """``pid``'s peak resident memory (``VmHWM``) since it started or ``reset_peak_rss``, MiB."""
    value = status_field(pid, "VmHWM")
    if value is None:
        raise AssertionError(f"no VmHWM for process {pid}")
    return int(value.split()[0]) / 1024


def reset_peak_rss(pid: int) -> float:
    """Start ``VmHWM`` afresh at the current resident size (``clear_refs`` 5); that size, MiB."""
    with open(f"/proc/{pid}/clear_refs", "w") as file:
        file.write("5")
    return peak_rss_mb(pid)


def comm(pid: int) -> str:
    """The command name of ``pid`` (``""`` when it is gone)."""
    try:
        with open(f"/proc/{pid}/comm") as file:
            return file.read().strip()
    except OSError:
        return ""


def cmdline(pid: int) -> bytes:
    """The arguments ``pid`` was started with, each ended by a NUL (``b""`` when it is gone)."""
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as file:
            return file.read()
    except OSError:
        return b""


def open_files(pid: int) -> list[str]:
    """Where ``pid``'s open file descriptors point (a deleted file's ends in ``(deleted)``)."""
    directory = f"/proc/{pid}/fd"
    targets = []
    for fd in os.listdir(directory):
        try:
            targets.append(os.readlink(f"{directory}/{fd}"))
        except OSError:
            continue  # closed meanwhile
    return targets
