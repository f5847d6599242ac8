"""The real ``omp --mode rpc`` process, driven through its pipes and through ``RpcClient.spawn``.

Real processes, so real time: every test bounds itself with a generous ``trio.fail_after`` (CI
machines are small), and every test that spawns something asserts that nothing is left running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import msgspec
import procfs
import pytest
import trio

from omp.client import RpcClient, RpcConnectionClosed, RpcStartupError
from omp.protocol import commands as cmd
from omp.protocol.payloads import SessionState, TodoPhasesPayload

OMP = [sys.executable, "-m", "omp", "--mode", "rpc"]
MIB = 1024 * 1024
LIMIT = 120  # seconds; generous on purpose


async def wait_gone(pid: int, seconds: float = 10) -> bool:
    # Not our child, so there is nothing to wait on but its /proc entry.
    with trio.move_on_after(seconds):
        while procfs.alive(pid):  # noqa: ASYNC110
            await trio.sleep(0.05)
    return not procfs.alive(pid)


def big_todos(total: int) -> cmd.SetTodos:
    size = total // 3
    tasks = [cmd.TodoItem(content=chr(ord("a") + i) * size, status="pending") for i in range(3)]
    return cmd.SetTodos(phases=[cmd.TodoPhase(name="Big", tasks=tasks)])


async def test_the_first_stdout_line_is_the_ready_frame() -> None:
    with trio.fail_after(LIMIT):
        process = await trio.lowlevel.open_process(
            OMP, stdin=subprocess.PIPE, stdout=subprocess.PIPE, start_new_session=True)
        try:
            assert process.stdout is not None
            assert process.stdin is not None
            received = b""
            while b"\n" not in received:
                data = await process.stdout.receive_some()
                assert data, "stdout ended before the first line"
                received += data
            first = msgspec.json.decode(received.partition(b"\n")[0])
            await process.stdin.aclose()
            assert await process.wait() == 0
        finally:
            if process.returncode is None:
                process.kill()
                await process.wait()
    assert first == {"type": "ready", "protocolVersion": 1, "supportedProtocolVersions": [1, 2],
                     "maxFrameBytes": 1048576, "maxReassembledFrameBytes": 67108864}


async def test_stdout_holds_only_json_frames() -> None:
    commands = [
        {"id": "a", "type": "get_state"},
        b"this is not json",
        {"id": "b", "type": "no_such_command"},
        {"id": "c", "type": "negotiate_protocol", "protocolVersion": 2},
        msgspec.to_builtins(big_todos(3 * MIB)) | {"id": "d"},
        {"id": "e", "type": "set_steering_mode", "mode": "all"},
    ]
    stdin = b"".join(
        (c if isinstance(c, bytes) else msgspec.json.encode(c)) + b"\n" for c in commands)
    with trio.fail_after(LIMIT):
        result = await trio.run_process(OMP, stdin=stdin, capture_stdout=True,
                                        start_new_session=True, check=False)
    assert result.returncode == 0
    lines = result.stdout.split(b"\n")
    assert lines[-1] == b""  # every frame ends with a newline, nothing follows
    frames: list[dict[str, Any]] = [msgspec.json.decode(line) for line in lines[:-1]]
    assert all(isinstance(f, dict) and isinstance(f.get("type"), str) for f in frames)
    assert all(len(line) < MIB for line in lines)
    assert frames[0]["type"] == "ready"
    chunks = [f for f in frames if f["type"] == "rpc_chunk"]
    assert len(chunks) >= 12
    answered = [f.get("id") for f in frames if f["type"] == "response"]
    assert answered == ["a", None, "b", "c", "e"]  # "d" came as chunks


async def test_spawned_server_echoes_ids() -> None:
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn() as client:
            generated = await client.request(cmd.GetState())
            own = await client.request(cmd.GetState(id="host-7"))
            raw = await client.request({"type": "get_state", "id": 12})
            state = await client.call(cmd.GetState(), type=SessionState)
    assert generated.id == "req_2"  # req_1 was the protocol negotiation
    assert own.id == "host-7"
    assert raw.id == 12
    assert state.todoPhases == []


async def test_eof_makes_the_server_exit_zero_promptly() -> None:
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn(close_timeout=LIMIT) as client:
            await client.call(cmd.GetState())
            pid = client.pid
            assert pid is not None
            closing = trio.current_time()
        closed = trio.current_time() - closing
    assert client.returncode == 0  # it exited by itself: no signal was needed
    assert closed < 15
    assert not procfs.alive(pid)


async def test_v2_chunked_frame_from_the_process_is_reassembled() -> None:
    todos = big_todos(3 * MIB)
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn() as client:
            assert client.protocol_version == 2
            payload = await client.call(todos, type=TodoPhasesPayload)
            again = await client.call(cmd.GetState(), type=SessionState)
    assert [t.content for t in payload.todoPhases[0].tasks] == [
        t.content for t in todos.phases[0].tasks]
    assert isinstance(again.todoPhases, list)
    assert sum(len(t.content) for t in again.todoPhases[0].tasks) == 3 * MIB  # chunked again


async def test_no_process_is_left_after_the_client_closes() -> None:
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn() as client:
            pid = client.pid
            assert pid is not None
            assert procfs.alive(pid)
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # exited and reaped, not a zombie


async def test_a_cancelled_body_leaves_no_process() -> None:
    pid: int | None = None
    with trio.fail_after(LIMIT), trio.CancelScope() as scope:
        async with RpcClient.spawn() as client:
            pid = client.pid
            scope.cancel()
            await trio.sleep_forever()
    assert scope.cancelled_caught
    assert pid is not None
    assert client.returncode == 0  # EOF still went first; the server exited on its own
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)


async def test_cancelled_while_starting_leaves_no_process(tmp_path: Path) -> None:
    # A server that is slow to become ready: the cancellation lands during __aenter__.
    script = tmp_path / "slow_ready.py"
    pid_file = tmp_path / "pid"
    script.write_text(textwrap.dedent(f"""
        import os, time
        open({str(pid_file)!r}, "w").write(str(os.getpid()))
        time.sleep(600)
    """))
    with trio.fail_after(LIMIT):
        with trio.move_on_after(2) as scope:
            async with RpcClient.spawn(command=[sys.executable, str(script)], close_timeout=0.5,
                                       terminate_grace=0.5):
                pytest.fail("must not start")
        assert scope.cancelled_caught
        pid = int(pid_file.read_text())
        assert await wait_gone(pid)


async def test_exit_before_ready_is_a_startup_error() -> None:
    with trio.fail_after(LIMIT):
        with pytest.raises(RpcStartupError, match="exited with code 2 before its ready frame"):
            async with RpcClient.spawn(("--mode", "nonsense"), stderr=subprocess.DEVNULL):
                pytest.fail("must not start")


STUBBORN_SERVER = """
import json, signal, subprocess, sys, time
if {ignore_term}:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({{"type": "ready"}}))
print(json.dumps({{"type": "grandchild", "pid": child.pid}}), flush=True)
sys.stdin.read()  # EOF comes ...
time.sleep(600)   # ... and is ignored
"""


@pytest.mark.frames_off_schema("a stand-in server reports its child in a frame of its own")
@pytest.mark.parametrize(("ignore_term", "expected"), [
    (False, -signal.SIGTERM),
    (True, -signal.SIGKILL),
])
async def test_a_server_that_ignores_eof_is_stopped_with_its_process_group(
        ignore_term: bool, expected: int) -> None:
    code = STUBBORN_SERVER.format(ignore_term=ignore_term)
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn(command=[sys.executable, "-c", code], close_timeout=0.5,
                                   terminate_grace=0.5) as client:
            assert client.protocol_version == 1
            grandchild = await client.events.receive()
            assert isinstance(grandchild, dict)
            pid = client.pid
            assert pid is not None
        assert client.returncode == expected
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
        assert await wait_gone(grandchild["pid"])


async def test_a_missing_executable_raises_its_own_error() -> None:
    with trio.fail_after(LIMIT), pytest.raises(FileNotFoundError):
        async with RpcClient.spawn(command=["/nonexistent/omp", "--mode", "rpc"]):
            pytest.fail("must not start")


@pytest.mark.frames_off_schema("a stand-in server reports its environment in a frame of its own")
async def test_env_and_cwd_reach_the_process(tmp_path: Path) -> None:
    code = textwrap.dedent("""
        import json, os, sys
        print(json.dumps({"type": "ready"}))
        print(json.dumps({"type": "where", "cwd": os.getcwd(),
                          "marker": os.environ.get("OMP_TEST_MARKER")}), flush=True)
        sys.stdin.read()
    """)
    env = dict(os.environ, OMP_TEST_MARKER="here")
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn(command=[sys.executable, "-c", code], env=env,
                                   cwd=tmp_path) as client:
            where = await client.events.receive()
    assert where == {"type": "where", "cwd": str(tmp_path), "marker": "here"}
    assert client.returncode == 0


async def test_spawn_in_a_repository_imports_none_of_its_code(tmp_path: Path) -> None:
    """``python -m omp`` puts the cwd first on the import path: a repository's ``trio.py`` (or
    ``omp/``) ran in place of ours, untrusted. The spawned server must import neither."""
    repo = tmp_path / "repo"
    (repo / "omp").mkdir(parents=True)
    for module in ("trio.py", "msgspec.py", "omp/__init__.py"):
        (repo / module).write_text(
            f"open({str(tmp_path / 'ran')!r}, 'a').write({module!r} + '\\n')\n")
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn(args=["--mode", "rpc", "--no-session"], cwd=repo) as client:
            state = await client.call(cmd.GetState(), SessionState)
    assert not (tmp_path / "ran").exists(), (tmp_path / "ran").read_text()
    assert state.isStreaming is False
    assert client.returncode == 0


async def test_a_server_that_dies_fails_the_waiting_request() -> None:
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn() as client:
            assert client.pid is not None
            os.kill(client.pid, signal.SIGKILL)
            with pytest.raises(RpcConnectionClosed, match="the server closed the connection"):
                await client.request(cmd.GetState())
    assert client.returncode == -signal.SIGKILL


async def test_a_huge_session_name_is_refused_and_get_state_keeps_working() -> None:
    # Every v1 get_state carries the name: 10 MB would make each one fail (frame too large).
    with trio.fail_after(LIMIT):
        async with RpcClient.spawn(("--mode", "rpc", "--no-session"),
                                   protocol_version=1) as client:
            huge = await client.request(cmd.SetSessionName(name="n" * 10_000_000))
            fits = await client.request(cmd.SetSessionName(name="n" * 1000))
            state = await client.request(cmd.GetState())
    assert huge.success is False
    assert huge.error == ("Session name is too long: 10,000,000 characters (the limit is "
                          "1,000)")
    assert huge.code == "invalid_params"
    assert fits.success is True
    assert state.success is True
    assert isinstance(state.data, dict)
    assert state.data["sessionName"] == "n" * 1000


@pytest.mark.skipif(not os.path.exists("/proc/self/task"), reason="needs Linux procfs")
def test_the_kernels_children_list_finds_the_children_a_full_scan_finds() -> None:
    from omp.process import _children, _children_at_start

    kids = [subprocess.Popen(["sleep", "30"]) for _ in range(3)]
    pids = {k.pid for k in kids}
    try:
        # (Other children of this test process may come and go meanwhile: only ours are
        # compared.)
        assert pids <= _children_at_start()
        assert pids <= {p.pid for p in _children(frozenset())}
    finally:
        for kid in kids:
            kid.kill()
            kid.wait()
