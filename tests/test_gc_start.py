"""The ``omp`` command runs no garbage collection while it starts (omp.cli).

A start allocates tens of thousands of objects that live as long as the process and almost no
garbage; before this, about 80 collections walked them again before ``ready`` (15-20 ms of a
start, bench_rpc). ``entry`` turns the collector off; ``--mode rpc`` turns it on once ``ready``
is out (``ServeOptions.on_ready``) and freezes what the start built, every other way of running
before its work begins. ``import omp`` alone imports nothing else, so that this holds for
``python -m omp`` too (the package is imported before its ``__main__``).
"""

from __future__ import annotations

import functools
import json
import subprocess
import sys
from pathlib import Path

import trio
from extension_helpers import install, open_process_host

import omp

LIMIT = 60

REPORT = '''
import gc, json

def setup(omp):
    # Extensions load after ready: the collector is on again by then.
    with open({path!r}, "w") as f:
        json.dump({{"enabled": gc.isenabled(), "frozen": gc.get_freeze_count()}}, f)
'''


def report(agent_dir: Path, path: Path) -> None:
    install(agent_dir, "gc_report", REPORT.format(path=str(path)))


async def test_rpc_turns_the_collector_on_after_ready_with_the_start_frozen(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    out = tmp_path / "gc.json"
    report(isolated_agent_dir, out)
    cwd = tmp_path / "project"
    cwd.mkdir()
    with trio.fail_after(LIMIT):
        async with open_process_host(cwd) as host:
            assert host.startup[0]["type"] == "ready"
    state = json.loads(out.read_text())
    assert state["enabled"] is True
    # The modules, classes and functions of a start: tens of thousands of objects.
    assert state["frozen"] > 10_000


def test_one_shot_modes_run_with_the_collector_on(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    out = tmp_path / "gc.json"
    report(isolated_agent_dir, out)
    done = subprocess.run(
        [sys.executable, "-m", "omp", "--model", "offline/echo", "--no-session", "-p", "hi"],
        cwd=tmp_path, capture_output=True, timeout=LIMIT, check=False)
    assert done.returncode == 0, done.stderr
    assert json.loads(out.read_text())["enabled"] is True


ENTRY = """
import gc, sys
from omp import cli

def main():
    print(gc.isenabled(), "trio" in sys.modules)
    return 0

cli.main = main
sys.exit(cli.entry())
"""


def test_the_command_starts_with_the_collector_off_and_nothing_imported() -> None:
    done = subprocess.run([sys.executable, "-c", ENTRY], capture_output=True, timeout=LIMIT,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"False", b"False"]


def test_importing_the_package_imports_nothing_else_until_a_name_is_used() -> None:
    code = ("import sys, omp; before = 'trio' in sys.modules; omp.serve; "
            "print(before, 'trio' in sys.modules, omp.ServeOptions.__name__)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, timeout=LIMIT,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [b"False", b"True", b"ServeOptions"]


async def test_on_ready_is_called_once_between_ready_and_the_commands_list() -> None:
    # ServeOptions.on_ready, as an embedding program sees it: once, after ready went out and
    # before the start's work that follows (the extensions, then available_commands_update).
    seen: list[bytes] = []
    calls: list[bytes] = []
    options = omp.ServeOptions(persist=False, announce_offline=False,
                               on_ready=lambda: calls.append(b"".join(seen)))
    to_server, server_in = omp.memory_pipe()
    server_out, from_server = omp.memory_pipe()
    with trio.fail_after(LIMIT):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(functools.partial(omp.serve, server_in, server_out,
                                                 options=options))
            while b"available_commands_update" not in b"".join(seen):
                seen.append(await from_server.receive_some())
            await to_server.aclose()  # EOF: serve() returns
    assert len(calls) == 1
    assert b"available_commands_update" not in calls[0]
    assert b"".join(seen).startswith(b'{"type":"ready"')
