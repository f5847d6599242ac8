"""The ``eval`` tool through the real ``omp --mode rpc`` process and the fake LLM
(``omp.tools.eval``, ``omp.tools.eval_kernel``): one IPython kernel per session, started by the
first call; names kept across calls, ``reset`` wiping them, a session change ending the kernel
and all it started; output, the last value, tracebacks and PNG displays in the result; an abort
interrupting a busy cell with one tool end; no kernel left once the server has exited; the
kernel's environment without provider keys; and, where ``jupyter_client`` cannot be imported, no
tool and a ``--tools eval`` that says what to install.

Cells write what the test needs to know (the kernel's pid) to files, so the test waits for
events, never for a duration.
"""

from __future__ import annotations

import base64
import json
import subprocess
import sys
import tempfile
import threading
import zlib
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
import trio.testing
from agent_helpers import (
    assert_tool_calls_paired,
    of_type,
    open_agent,
    text_reply,
    tool_call,
    tool_result_text,
    tools_reply,
    wait_for_file,
)

from omp.config import ConfigError
from omp.session.settings import load_settings
from omp.tools import eval as eval_tool
from omp.tools.eval import KERNEL_LOST, CellOutput, cell_timeout, traceback_text
from omp.tools.eval_settings import INSTALL_HINT, EvalSettings, missing_dependencies
from omp.tools.shell import create_spill_file
from omp.tools.truncate import ELISION_HEAD_BYTES

TEST_TIMEOUT = 120  # a kernel's start imports IPython: seconds on a loaded 2-core machine

needs_kernel = pytest.mark.skipif(
    bool(missing_dependencies()),
    reason="jupyter_client / ipykernel are not installed (the test extra installs them)")

async def kernel_pid(path: Path) -> int:
    """The pid a cell wrote to ``path`` (``PID_TO_FILE``), once it is there: bounded by the
    test's own deadline only, as a kernel's first start on a loaded machine can take long."""
    return int((await wait_for_file(path)).strip())


PID_TO_FILE = "import os\nopen('kernel.pid', 'w').write(f'{os.getpid()}\\n')\n"


def py(call_id: str, code: str, **more: Any) -> dict[str, Any]:
    return tool_call(call_id, "eval", {"language": "py", "code": code, **more})


def results(frames: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """The toolResult messages by call id."""
    return {f["message"]["toolCallId"]: f["message"] for f in of_type(frames, "message_end")
            if f["message"]["role"] == "toolResult"}


def png(width: int = 2, height: int = 1) -> bytes:
    """A valid PNG of ``width`` x ``height`` red pixels (no imaging library needed)."""
    def chunk(kind: bytes, data: bytes) -> bytes:
        body = kind + data
        return (len(data).to_bytes(4, "big") + body
                + zlib.crc32(body).to_bytes(4, "big"))

    header = width.to_bytes(4, "big") + height.to_bytes(4, "big") + bytes([8, 2, 0, 0, 0])
    rows = b"".join(b"\x00" + b"\xff\x00\x00" * width for _ in range(height))
    return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows))
            + chunk(b"IEND", b""))


@needs_kernel
async def test_names_persist_reset_wipes_them_and_no_kernel_outlives_the_server(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [
        tools_reply(py("set", PID_TO_FILE + "x = 41\nprint('set')")),
        # Flushed: the kernel sends each stream's text on its own schedule, so two unflushed
        # streams may arrive interleaved ("stderrstdout\n\n42" once in CI).
        tools_reply(py("use", "print('stdout', flush=True)\n"
                              "import sys; print('stderr', file=sys.stderr, flush=True)\n"
                              "x + 1")),
        tools_reply(py("big", "print('y' * 100_000)")),
        tools_reply(tool_call("js", "eval", {"language": "js", "code": "1 + 1"})),
        tools_reply(py("reset", "x", reset=True)),
        tools_reply(py("pid", "import os; os.getpid()")),
        text_reply("done")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Compute", id="p1")
            frames = await agent.until_settled()
            first_kernel = await kernel_pid(tmp_path / "kernel.pid")
            server = agent.pid
        # The server has exited: its kernels with it.
        assert not procfs.alive(first_kernel)
    assert_tool_calls_paired(frames)
    got = results(frames)
    assert tool_result_text(got["set"]) == "set"
    assert got["use"]["isError"] is False
    assert tool_result_text(got["use"]) == "stdout\nstderr\n42"
    # Bounded like bash: head and tail around an elision line, the whole output in a file.
    big = got["big"]
    assert "elided" in tool_result_text(big)
    full = trio.Path(big["details"]["fullOutputPath"])
    assert await full.read_text() == "y" * 100_000 + "\n"
    await full.unlink()
    assert got["js"]["isError"] is True
    assert "no JavaScript kernel" in tool_result_text(got["js"])
    # reset: a new kernel, without the name.
    assert got["reset"]["isError"] is True
    assert "NameError" in tool_result_text(got["reset"])
    second_kernel = int(tool_result_text(got["pid"]))
    assert second_kernel != first_kernel
    assert not procfs.alive(second_kernel)
    assert not procfs.alive(server)


@needs_kernel
async def test_an_exception_returns_its_traceback(tmp_path: Path,
                                                  isolated_agent_dir: Path) -> None:
    code = "print('before')\ndef inner():\n    raise ValueError('boom')\ninner()"
    script = [tools_reply(py("fail", code)), text_reply("seen")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Try", id="p1")
            frames = await agent.until_settled()
    result = results(frames)["fail"]
    text = tool_result_text(result)
    assert result["isError"] is True
    assert text.startswith("before\n")
    assert "Traceback (most recent call last)" in text
    assert "raise ValueError('boom')" in text
    assert text.endswith("ValueError: boom")
    assert "\x1b" not in text  # no terminal colours


@needs_kernel
async def test_a_png_display_comes_back_as_an_image(tmp_path: Path,
                                                    isolated_agent_dir: Path) -> None:
    data = png()
    code = ("from IPython.display import Image, display\n"
            f"display(Image(data={data!r}))\n"
            "class Red:\n"
            f"    def _repr_png_(self): return {data!r}\n"
            "Red()")
    script = [tools_reply(py("img", code)), text_reply("seen")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Draw", id="p1")
            frames = await agent.until_settled()
    result = results(frames)["img"]
    assert result["isError"] is False
    images = [b for b in result["content"] if b["type"] == "image"]
    assert [(i["mimeType"], base64.b64decode(i["data"])) for i in images] == [
        ("image/png", data), ("image/png", data)]
    assert tool_result_text(result) == "(displayed 2 images; no text output)"


@needs_kernel
async def test_abort_interrupts_a_busy_cell_and_the_kernel_keeps_its_names(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    script = [
        tools_reply(py("spin", PID_TO_FILE + "kept = 7\nwhile True:\n    pass")),
        tools_reply(py("after", "kept")),
        text_reply("done")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Spin", id="p1")
            kernel = await kernel_pid(tmp_path / "kernel.pid")
            abort_id = await agent.send("abort")
            await agent.until_response(abort_id)  # written once the run has ended
            aborted = list(agent.frames)
            # Interrupted, not killed: the same kernel, its names intact.
            assert procfs.alive(kernel)
            await agent.send("prompt", message="Again", id="p2")
            frames = await agent.until_settled()
        assert not procfs.alive(kernel)
    assert_tool_calls_paired(aborted)
    ends = [f for f in of_type(aborted, "tool_execution_end") if f["toolCallId"] == "spin"]
    assert len(ends) == 1
    assert ends[0]["isError"] is True
    assert "aborted" in tool_result_text(ends[0]["result"]).lower()
    (result,) = [f for f in of_type(aborted, "prompt_result") if f.get("id") == "p1"]
    assert result["status"] == "aborted"
    assert tool_result_text(results(frames)["after"]) == "7"


@needs_kernel
async def test_a_cell_past_its_timeout_is_interrupted(tmp_path: Path,
                                                      isolated_agent_dir: Path) -> None:
    # The cell's deadline is what is tested: the sleep is longer than the timeout.
    code = "import time\nprint('started', flush=True)\ntime.sleep(60)"
    script = [tools_reply(py("slow", code, timeout=1)), tools_reply(py("next", "1 + 1")),
              text_reply("done")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Wait", id="p1")
            frames = await agent.until_settled()
    got = results(frames)
    text = tool_result_text(got["slow"])
    assert got["slow"]["isError"] is True
    assert text.startswith("started\n")
    assert "KeyboardInterrupt" in text
    assert text.endswith("Cell timed out after 1 seconds.")
    assert tool_result_text(got["next"]) == "2"  # the kernel went on


@needs_kernel
async def test_a_lost_kernel_is_replaced_and_the_next_result_says_so(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # A kernel that dies in a cell, and one whose cell ignores the interrupt (it is killed
    # INTERRUPT_GRACE after its deadline): each time the next call gets a new kernel.
    ignores = ("import signal\nsignal.signal(signal.SIGINT, signal.SIG_IGN)\n"
               "while True:\n    pass")
    script = [
        tools_reply(py("die", PID_TO_FILE + "kept = 1\nos._exit(3)")),
        tools_reply(py("after-death", "'kept' in globals()")),
        tools_reply(py("stuck", ignores, timeout=1)),
        tools_reply(py("after-stuck", "2")),
        text_reply("done")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Break it", id="p1")
            frames = await agent.until_settled()
            first = await kernel_pid(tmp_path / "kernel.pid")
            assert not procfs.alive(first)
    got = results(frames)
    assert got["die"]["isError"] is True
    assert "The Python kernel died during the cell (exit code 3)" in tool_result_text(got["die"])
    assert tool_result_text(got["after-death"]) == f"{KERNEL_LOST}\n\nFalse"
    stuck = tool_result_text(got["stuck"])
    assert stuck.endswith("Cell timed out after 1 seconds. The kernel did not stop and was "
                          "restarted: the names defined before are gone.")
    assert tool_result_text(got["after-stuck"]) == f"{KERNEL_LOST}\n\n2"


@needs_kernel
async def test_a_session_change_ends_the_kernel_and_its_group(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    """``new_session`` stops the kernel (the AgentSession object survives the change, the
    tool with it): its process and what its cells started are gone once the command has
    answered, and the next call runs in a new kernel without the old names, not reported as
    a lost kernel."""
    child = ("import subprocess\nchild = subprocess.Popen(['sleep', '600'])\n"
             "open('child.pid', 'w').write(f'{child.pid}\\n')\n")
    script = [
        tools_reply(py("set", PID_TO_FILE + child + "x = 41")), text_reply("set"),
        tools_reply(py("after", "x")), text_reply("done")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Define x", id="p1")
            first = await agent.until_settled()
            kernel = await kernel_pid(tmp_path / "kernel.pid")
            sleeper = await kernel_pid(tmp_path / "child.pid")
            assert procfs.alive(kernel)
            assert procfs.alive(sleeper)
            await agent.data("new_session")
            # Gone by the time the command answered: no wait here.
            assert not procfs.alive(kernel)
            assert not procfs.alive(sleeper)
            assert not [p for p in procfs.group_members(kernel) if procfs.alive(p)]
            await agent.send("prompt", message="Use x", id="p2")
            second = await agent.until_settled()
    assert results(first)["set"]["isError"] is False
    after = results(second)["after"]
    assert after["isError"] is True
    assert "NameError" in tool_result_text(after)
    assert KERNEL_LOST not in tool_result_text(after)


@needs_kernel
async def test_the_kernel_gets_no_provider_key(tmp_path: Path, isolated_agent_dir: Path,
                                               monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ANTHROPIC_API_KEY", "sk-ant-never-in-the-kernel")
    monkeypatch.setenv("OMP_EVAL_PLAIN", "inherited")
    code = (PID_TO_FILE + "import os\n"
            "[os.environ.get(n) for n in ('ANTHROPIC_API_KEY', 'OMP_EVAL_PLAIN')]")
    script = [tools_reply(py("env", code)), text_reply("done")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Env", id="p1")
            frames = await agent.until_settled()
            kernel = await kernel_pid(tmp_path / "kernel.pid")
            environ = await trio.Path(f"/proc/{kernel}/environ").read_bytes()
    assert tool_result_text(results(frames)["env"]) == "[None, 'inherited']"
    assert b"sk-ant-never-in-the-kernel" not in environ
    assert b"OMP_EVAL_PLAIN=inherited" in environ


@needs_kernel
async def test_a_temp_directory_too_deep_for_unix_sockets_still_gets_a_kernel(
        tmp_path: Path, isolated_agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A unix socket's address holds 107 bytes: the kernel's sockets go over loopback TCP then.
    deep = tmp_path / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(deep))
    script = [tools_reply(py("deep", "6 * 7")), text_reply("done")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script) as agent:
            await agent.send("prompt", message="Deep", id="p1")
            frames = await agent.until_settled()
    assert tool_result_text(results(frames)["deep"]) == "42"
    assert list(deep.iterdir()) == []  # the kernel's directory is removed with it


BLOCKER = """\
import sys

class _NotInstalled:
    # Makes these packages unimportable, as if they were not installed (tests/test_eval_tool.py).
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in ("jupyter_client", "ipykernel"):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None

sys.meta_path.insert(0, _NotInstalled())
"""


def test_without_the_kernel_packages_eval_is_not_offered_and_asking_says_what_to_install(
        tmp_path: Path, isolated_agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A sitecustomize on PYTHONPATH puts a finder first on sys.meta_path that refuses the two
    # packages: for the server they are not installed.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text(BLOCKER)
    monkeypatch.setenv("PYTHONPATH", str(shim))
    omp = [sys.executable, "-P", "-m", "omp", "--mode", "rpc", "--no-session",
           "--model", "offline/echo"]
    asked = subprocess.run([*omp, "--tools", "read,eval"], capture_output=True, text=True,
                           timeout=60, stdin=subprocess.DEVNULL, cwd=tmp_path, check=False)
    assert asked.returncode != 0
    assert "jupyter_client and ipykernel" in asked.stderr
    assert INSTALL_HINT in asked.stderr
    state = subprocess.run(omp, input='{"id": "s", "type": "get_state"}\n',
                           capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           check=True)
    (response,) = [json.loads(line) for line in state.stdout.splitlines()
                   if json.loads(line).get("id") == "s"]
    names = [tool["name"] for tool in response["data"]["dumpTools"]]
    assert "read" in names
    assert "eval" not in names


def test_eval_py_false_offers_no_eval_and_asking_names_the_setting(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "config.yml").write_text("eval:\n  py: false\n  timeout: 5\n")
    asked = subprocess.run([sys.executable, "-P", "-m", "omp", "--mode", "rpc", "--no-session",
                            "--model", "offline/echo", "--tools", "eval"],
                           capture_output=True, text=True, timeout=60, cwd=tmp_path,
                           stdin=subprocess.DEVNULL, check=False)
    assert asked.returncode != 0
    assert "`eval.py: false` in config.yml" in asked.stderr


def test_the_eval_settings_are_read_and_checked(tmp_path: Path) -> None:
    (tmp_path / "config.yml").write_text("eval:\n  timeout: 0\n  js: true\n")
    settings = load_settings(tmp_path)
    assert (settings.eval.py, settings.eval.timeout) == (True, 0)
    assert cell_timeout({}, settings.eval) is None  # 0: no deadline
    assert cell_timeout({"timeout": 5000}, settings.eval) == 3600
    assert cell_timeout({"timeout": 0.2}, EvalSettings()) == 1
    assert cell_timeout({}, EvalSettings()) == 30
    (tmp_path / "config.yml").write_text("eval:\n  timeout: -2\n")
    with pytest.raises(ConfigError, match=r"\$\.eval\.timeout: must be between 0"):
        load_settings(tmp_path)


def test_a_traceback_loses_its_colours_rule_and_middle_frames() -> None:
    frames = [f"\x1b[36mFile x.py:{n}\x1b[39m in f{n}" for n in range(30)]
    text = traceback_text(["\x1b[31m" + "-" * 75 + "\x1b[39m",
                           "\x1b[31mValueError\x1b[39m          Traceback (most recent call last)",
                           *frames, "\x1b[31mValueError\x1b[39m: bad"])
    lines = text.split("\n")
    assert lines[0] == "ValueError  Traceback (most recent call last)"
    assert lines[1:3] == ["File x.py:0 in f0", "File x.py:1 in f1"]
    assert lines[3] == "[… 18 frames elided …]"
    assert lines[-1] == "ValueError: bad"
    assert len(lines) == 2 + 12 + 1
    assert "\x1b" not in text


async def test_flushes_from_two_tasks_create_one_spill_file_in_order(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The kernel's reader and the call's progress updates both flush a cell's output: the
    second flush waits for the first, so the spill file is created once and holds the output
    in order. (The first one's file creation is held in its thread until the second has
    started, the moment two unordered flushes would both create a file.)"""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    entered, release = threading.Event(), threading.Event()

    def held_create(prefix: str) -> tuple[int, Path]:
        entered.set()
        release.wait(30)
        return create_spill_file(prefix)

    monkeypatch.setattr(eval_tool, "create_spill_file", held_create)
    output = CellOutput(max_bytes=ELISION_HEAD_BYTES + 10)
    first = "a" * (ELISION_HEAD_BYTES + 20)  # over the limit: the output spills
    await output.take({"msg_type": "stream", "content": {"text": first}})
    with trio.fail_after(30):
        async with trio.open_nursery() as nursery:
            nursery.start_soon(output.flush)
            await trio.to_thread.run_sync(entered.wait, 30)
            await output.take({"msg_type": "stream", "content": {"text": "b" * 40}})
            nursery.start_soon(output.flush)
            await trio.testing.wait_all_tasks_blocked()
            release.set()
    output.close()
    (spilled,) = await trio.to_thread.run_sync(lambda: list(tmp_path.glob("omp-eval-*.log")))
    assert spilled.read_bytes() == first.encode() + b"b" * 40
