"""The `omp` command line as a user runs it: usage errors, broken stdout, EOF."""

from __future__ import annotations

import os
import subprocess
import sys

import trio

OMP = [sys.executable, "-m", "omp"]


async def run(*args: str, stdin: bytes = b"") -> subprocess.CompletedProcess[bytes]:
    with trio.fail_after(30):
        return await trio.run_process([*OMP, *args], stdin=stdin, capture_stdout=True,
                                      capture_stderr=True, check=False)


async def test_help_and_version() -> None:
    help_ = await run("--help")
    assert help_.returncode == 0
    assert b"--mode {rpc,text,json}" in help_.stdout
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
    assert at_file.returncode == 2
    assert b"@file arguments are not supported" in at_file.stderr


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
