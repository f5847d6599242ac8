"""The `omp` command line as a user runs it: usage errors, broken stdout, EOF."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import procfs
import pytest
import trio
from agent_helpers import write_models_yml

OMP = [sys.executable, "-m", "omp"]


async def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(30):
        return await trio.run_process([*OMP, *args], stdin=stdin, capture_stdout=True,
                                      capture_stderr=True, check=False)


async def test_help_and_version() -> None:
    help_ = await run("--help")
    assert help_.returncode == 0
    assert b"--mode {rpc,rpc-ui,text,json,acp}" in help_.stdout
    for flag in (b"--extension", b"--no-extensions", b"--trust-project", b"--no-ui"):
        assert flag in help_.stdout
    version = await run("--version")
    assert version.returncode == 0
    assert version.stdout.startswith(b"omp 0.")


async def test_unknown_option_is_a_usage_error() -> None:
    result = await run("--mode", "rpc", "--frobnicate")
    assert result.returncode == 2
    assert result.stdout == b""
    assert b"usage: omp" in result.stderr
    assert b"unrecognized arguments: --frobnicate" in result.stderr


async def test_missing_mode_and_bad_values_are_usage_errors() -> None:
    assert (await run()).returncode == 2
    bad = await run("--mode", "rpc", "--max-line-bytes", "0")
    assert bad.returncode == 2
    assert b"expected a positive integer, got 0" in bad.stderr
    at_file = await run("--mode", "rpc", "@args.txt")
    assert at_file.returncode == 1  # as the original
    assert at_file.stderr == b"omp: @file arguments are not supported in RPC mode\n"


async def test_eof_exits_zero_and_stdout_holds_only_frames() -> None:
    result = await run("--mode", "rpc", stdin=b'{"id":"1","type":"get_state"}\nnot json\n')
    assert result.returncode == 0
    lines = result.stdout.split(b"\n")
    assert lines[-1] == b""
    assert [trio_json(line)["type"] for line in lines[:-1]] == [
        "ready", "available_commands_update", "response", "response"]


def trio_json(line: bytes) -> dict[str, object]:
    import json

    value = json.loads(line)
    assert isinstance(value, dict)
    return value


async def test_broken_stdout_exits_one_with_a_reason() -> None:
    read_end, write_end = os.pipe()
    os.close(read_end)  # the host is gone before we write anything
    try:
        with trio.fail_after(30):
            proc = await trio.lowlevel.open_process(
                [*OMP, "--mode", "rpc", "--model", "offline/echo"], stdin=subprocess.PIPE,
                stdout=write_end,
                stderr=subprocess.PIPE)
            os.close(write_end)
            write_end = -1
            # stdin stays open: the process must exit because of stdout alone.
            assert proc.stderr is not None
            err = b""
            while chunk := await proc.stderr.receive_some(4096):
                err += chunk
            assert await proc.wait() == 1
            assert proc.stdin is not None
            await proc.stdin.aclose()
    finally:
        if write_end >= 0:
            os.close(write_end)
    assert err == b"omp: stdout closed: [Errno 32] Broken pipe\n"
    assert err.count(b"\n") == 1


@pytest.mark.parametrize("args", [
    ["models", "--json"], ["models", "--all"], ["models", "--help"], ["schema"], ["help"],
    ["--help"], ["--version"], ["-p", "hi", "--model", "offline/echo", "--no-session"],
    ["--mode", "json", "hi", "--model", "offline/echo", "--no-session"],
])
async def test_every_command_ends_quietly_on_a_closed_stdout(args: list[str],
                                                             tmp_path: Path) -> None:
    """``omp models --json | head -c 100``: one line and status 1, never a traceback (nor
    argparse's status 0 with the help cut off)."""
    read_end, write_end = os.pipe()
    os.close(read_end)  # the reader is gone before anything is written
    try:
        with trio.fail_after(30):
            done = await trio.run_process([*OMP, *args], stdin=b"", stdout=write_end,
                                          capture_stderr=True, check=False, cwd=tmp_path)
    finally:
        os.close(write_end)
    assert done.returncode == 1, done.stderr
    assert done.stderr == b"omp: stdout closed: [Errno 32] Broken pipe\n"


EMBEDDED = """
import trio, omp

async def say(command):
    print("stray output from a handler", flush=True)
    return {"said": True}

trio.run(lambda: omp.serve(options=omp.ServeOptions(commands={"say": say})))
print("after serve", flush=True)
"""


async def test_stray_prints_never_reach_the_protocol_stream() -> None:
    with trio.fail_after(30):
        result = await trio.run_process(
            [sys.executable, "-c", EMBEDDED], stdin=b'{"id":"s","type":"say"}\n',
            capture_stdout=True, capture_stderr=True)
    lines = result.stdout.decode().splitlines()
    # While serving, fd 1 carries frames only; once serve() returns, stdout is the caller's.
    assert [trio_json(line.encode())["type"] for line in lines[:-1]] == [
        "ready", "available_commands_update", "response"]
    assert trio_json(lines[2].encode())["data"] == {"said": True}
    assert lines[-1] == "after serve"
    assert b"stray output from a handler" in result.stderr


# --- one-shot modes ---------------------------------------------------------------------------

ONE_SHOT = [*OMP, "--model", "offline/echo", "--no-session"]


async def one_shot(*args: str, cwd: Path | None = None) -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(60):
        return await trio.run_process([*ONE_SHOT, *args], stdin=b"", capture_stdout=True,
                                      capture_stderr=True, check=False, cwd=cwd)


async def test_json_message_updates_are_deltas_unless_full_is_asked() -> None:
    message = "word " * 2000  # the offline model echoes it, a delta per word
    snapshot = await one_shot("--mode", "json", "--message-updates", "full", message)
    delta = await one_shot("--mode", "json", message)
    assert snapshot.returncode == delta.returncode == 0
    # The snapshot form repeats the answer so far in every update: quadratic in its length.
    assert len(snapshot.stdout) > 50 * len(delta.stdout)
    assert len(delta.stdout) < 40 * len(message)
    updates = [json.loads(line) for line in delta.stdout.splitlines()
               if b'"message_update"' in line]
    assert updates
    assert all("message" not in u for u in updates)
    text = "".join(u["assistantMessageEvent"].get("delta", "") for u in updates)
    assert text == f"Echo: {message.strip()}"
    # The same frames rpc writes after set_event_filter {"messageUpdates": "delta"}.
    assert updates[1] == {"type": "message_update", "assistantMessageEvent": {
        "type": "text_delta", "contentIndex": 0, "delta": "Echo: "}}
    # The same events in the same order; only the updates' form differs.
    assert kinds(delta.stdout) == kinds(snapshot.stdout)


def kinds(output: bytes) -> list[str]:
    return [json.loads(line)["type"] for line in output.splitlines()]


async def test_message_updates_is_only_for_json_mode() -> None:
    rpc = await run("--mode", "rpc", "--message-updates", "delta")
    assert rpc.returncode == 2
    assert b"--message-updates is for --mode json" in rpc.stderr
    bad = await run("--mode", "json", "--message-updates", "sometimes", "hi")
    assert bad.returncode == 2


async def test_print_mode_says_on_stderr_what_it_retries(tmp_path: Path,
                                                        isolated_agent_dir: Path) -> None:
    # Nothing listens on port 9: every call fails with a connection error, which is retried.
    write_models_yml(isolated_agent_dir, "http://127.0.0.1:9")
    (isolated_agent_dir / "config.yml").write_text("retry: {maxRetries: 2, baseDelayMs: 10}\n")
    with trio.fail_after(60):
        result = await trio.run_process(
            [*OMP, "--model", "fake/fake-model", "--no-session", "-p", "hello"], stdin=b"",
            capture_stdout=True, capture_stderr=True, check=False, cwd=tmp_path)
    assert result.returncode == 1
    lines = result.stderr.decode().splitlines()
    retries = [line for line in lines if "retrying in" in line]
    assert len(retries) == 2, lines
    assert retries[0].startswith("omp: ")
    assert retries[0].endswith("(retry 1/2)")
    assert retries[1].endswith("(retry 2/2)")
    assert "Traceback" not in result.stderr.decode()


async def test_broken_stdout_during_a_json_run_is_one_line() -> None:
    # The run streams events (a bash tool that prints for a while) when the reader goes away.
    command = json.dumps({"command": "for i in $(seq 200); do echo x; sleep 0.01; done"})
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(
            [*ONE_SHOT, "--mode", "json", f"[[tool bash {command}]]"], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            assert proc.stdout is not None
            assert proc.stderr is not None
            assert await proc.stdout.receive_some(100)  # the run is under way
            await proc.stdout.aclose()
            err = b""
            while chunk := await proc.stderr.receive_some(4096):
                err += chunk
            assert await proc.wait() == 1
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert err == b"omp: stdout closed: [Errno 32] Broken pipe\n"


async def test_ctrl_c_in_print_mode_is_one_line() -> None:
    command = json.dumps({"command": "sleep 300"})
    with trio.fail_after(60):
        proc = await trio.lowlevel.open_process(
            [*ONE_SHOT, "-p", f"[[tool bash {command}]]"], stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
        try:
            assert proc.stderr is not None
            while not any(procfs.comm(pid) == "sleep" for pid in children_of(proc.pid)):  # noqa: ASYNC110
                await trio.sleep(0.02)
            proc.send_signal(signal.SIGINT)
            err = b""
            while chunk := await proc.stderr.receive_some(4096):
                err += chunk
            assert await proc.wait() == 130
        finally:
            if proc.returncode is None:
                proc.kill()
                await proc.wait()
    assert err == b"omp: interrupted\n"


def children_of(pid: int) -> list[int]:
    """Processes whose session is led by a child of ``pid`` (the shell and what it runs)."""
    return [p.pid for p in procfs.processes()
            if (leader := procfs.stat(p.session)) is not None and leader.ppid == pid]
