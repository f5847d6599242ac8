"""The ``lsp`` tool (``omp.tools.lsp``, ``omp.lsp``): its pure parts, then the real
``omp --mode rpc`` process driving a real ``pylsp`` (python-lsp-server, from the test extra)
through the fake LLM.

The integration tests put this interpreter's ``bin`` directory (where pip put ``pylsp``) on
``PATH``, which the server's environment inherits: the tool finds ``pylsp`` the way a user's
install would. Each waits for frames, never for time.
"""

from __future__ import annotations

import os
import shutil
import signal
import sys
from pathlib import Path
from typing import Any

import procfs
import pytest
import trio
import trio.testing
from agent_helpers import (
    FAKE_ARGS,
    Frame,
    assert_tool_calls_paired,
    of_type,
    open_agent,
    text_reply,
    tool_call,
    tool_result_text,
    tools_reply,
    wait_until_gone,
)

from omp.lsp.client import ServerSpec, serve_server, uri_of
from omp.lsp.edits import Change, EditRefused, apply_changes, utf16_column
from omp.lsp.framing import HEADER_LIMIT, FramingError, MessageReader, encode
from omp.lsp.servers import LANGUAGES, find_root, languages
from omp.mcp.lines import Oversized
from omp.tools.base import ToolError
from omp.tools.lsp import symbol_column
from omp.tools.lsp_settings import LspServerSettings, LspSettings, validate

TEST_TIMEOUT = 90
BIN = Path(sys.executable).parent
LSP_ARGS = (*FAKE_ARGS, "--tools", "read,lsp")

A_PY = '''def greet(name):
    return "hi " + name


def main():
    print(greet("x"))
'''
B_PY = '''from a import greet

greet("z")
print(undefined_name)
'''


# --- framing ----------------------------------------------------------------------------------


def test_messages_split_at_every_byte_come_out_whole() -> None:
    stream = encode(b'{"id":1}') + encode(b"") + encode('{"x":"é"}'.encode())
    for cut in range(len(stream) + 1):
        reader = MessageReader(1024)
        got = reader.feed(stream[:cut]) + reader.feed(stream[cut:])
        assert got == [b'{"id":1}', b"", '{"x":"é"}'.encode()], cut
        assert reader.buffered == 0


def test_a_message_fed_byte_by_byte_costs_one_pass() -> None:
    body = b"x" * 200_000
    reader = MessageReader(1 << 20)
    data = b"Content-Type: application/vscode-jsonrpc\r\n" + encode(body)
    out = []
    for i in range(0, len(data), 7):
        out += reader.feed(data[i:i + 7])
    assert out == [body]


def test_an_oversized_body_is_dropped_keeping_its_edges() -> None:
    body = b'{"jsonrpc":"2.0","id":7,"result":"' + b"y" * 50_000 + b'"}'
    reader = MessageReader(10_000)
    out = []
    for i in range(0, len(body) + 40, 999):
        out += reader.feed((encode(body) + encode(b"{}"))[i:i + 999])
    assert len(out) == 2
    dropped, after = out
    assert isinstance(dropped, Oversized)
    assert (dropped.size, dropped.limit) == (len(body), 10_000)
    assert dropped.head.startswith(b'{"jsonrpc":"2.0","id":7')
    assert after == b"{}"
    assert reader.buffered < 10_000


@pytest.mark.parametrize(("data", "why"), [
    (b"Content-Length: x\r\n\r\n", "not a number"),
    (b"Content-Type: a\r\n\r\n", "without Content-Length"),
    (b"garbage\r\n\r\n", "without a colon"),
    (b"Content-Length: 1" + b"1" * HEADER_LIMIT, "longer than"),
])
def test_what_is_no_lsp_message_is_an_error(data: bytes, why: str) -> None:
    with pytest.raises(FramingError, match=why):
        MessageReader(1 << 20).feed(data)


# --- positions and edits ----------------------------------------------------------------------


def test_the_symbol_is_found_on_its_line() -> None:
    text = "x = 1\n    foo(a_foo, foo)  # foo\n"
    assert symbol_column(text, 2, "foo") == 4
    assert symbol_column(text, 2, "foo#2") == 15
    assert symbol_column(text, 2, None) == 4
    assert symbol_column(text, 1, "x") == 0
    with pytest.raises(ToolError, match='"bar" not found on line 2'):
        symbol_column(text, 2, "bar")
    with pytest.raises(ToolError, match="occurs 3 time"):
        symbol_column(text, 2, "foo#4")
    with pytest.raises(ToolError, match="line 9 is out of range"):
        symbol_column(text, 9, "foo")


def test_columns_are_utf16_code_units() -> None:
    line = "s = '𝄞é'; name"
    assert utf16_column(line, line.index("name")) == line.index("name") + 1
    assert symbol_column(line + "\n", 1, "name") == line.index("name") + 1
    changed = apply_changes(line, [Change(0, 11, 0, 15, "other")], "t.py")
    assert changed == "s = '𝄞é'; other"


def test_edits_apply_against_the_original_text() -> None:
    text = "a b\r\nc d\n"
    edits = [Change(1, 2, 1, 3, "DD"), Change(0, 0, 0, 1, "AA")]
    assert apply_changes(text, edits, "t") == "AA b\r\nc DD\n"
    with pytest.raises(EditRefused, match="overlap"):
        apply_changes(text, [Change(0, 0, 0, 2, "x"), Change(0, 1, 0, 3, "y")], "t")
    with pytest.raises(EditRefused, match="past the end"):
        apply_changes(text, [Change(5, 0, 5, 1, "x")], "t")


def test_the_root_is_the_nearest_marked_directory_inside_the_workspace(tmp_path: Path) -> None:
    package = tmp_path / "pkg" / "sub"
    package.mkdir(parents=True)
    (tmp_path / "pkg" / "pyproject.toml").touch()
    markers = LANGUAGES[0].root_markers
    assert find_root(package / "m.py", tmp_path, markers) == tmp_path / "pkg"
    assert find_root(tmp_path / "m.py", tmp_path, markers) == tmp_path
    assert find_root(Path("/elsewhere/m.py"), tmp_path, markers) == tmp_path


def test_settings_add_change_and_remove_languages() -> None:
    settings = LspSettings(servers={
        "python": LspServerSettings(command="/opt/pyright", args=["--stdio"]),
        "zig": LspServerSettings(command="zls", fileTypes=[".zig"]),
        "go": LspServerSettings(enabled=False)})
    known = {language.name: language for language in languages(settings)}
    assert known["python"].commands == (("/opt/pyright", "--stdio"),)
    assert known["zig"].file_types == (".zig",)
    assert "go" not in known
    bad = LspSettings(timeoutSeconds=0, servers={"x": LspServerSettings(fileTypes=["py"])})
    assert [where for where, _ in validate(bad)] == ["$.lsp.timeoutSeconds",
                                                     "$.lsp.servers.x.fileTypes"]


# --- through the real process ----------------------------------------------------------------


@pytest.fixture
def project(tmp_path: Path, isolated_agent_dir: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    if shutil.which("pylsp", path=str(BIN)) is None:
        pytest.skip("pylsp is not installed (python-lsp-server comes with the test extra)")
    (tmp_path / "a.py").write_text(A_PY)
    (tmp_path / "b.py").write_text(B_PY)
    # `diagnostics` waits until pylsp published them; the bound is for a server that never
    # does, so here it is far beyond what a loaded machine takes (the wait ends at the
    # publication, not at the bound).
    (isolated_agent_dir / "config.yml").write_text("lsp:\n  diagnosticsWaitMs: 120000\n")
    monkeypatch.setenv("PATH", f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}")
    return tmp_path


def results(frames: list[Frame]) -> dict[str, dict[str, Any]]:
    return {f["message"]["toolCallId"]: f["message"] for f in of_type(frames, "message_end")
            if f["message"]["role"] == "toolResult"}


def pylsp_children(pid: int) -> list[int]:
    return [child for child in procfs.children(pid) if b"pylsp" in procfs.cmdline(child)]


def tool_names(request: Any) -> list[str]:
    return [t["function"]["name"] for t in request.json().get("tools", [])]


async def test_definition_references_and_diagnostics_from_pylsp(project: Path,
                                                                isolated_agent_dir: Path) -> None:
    # Three calls of one message run together: the first starts the server, the others wait
    # for it (one server, not three).
    script = [tools_reply(
        tool_call("d", "lsp", {"action": "definition", "file": "b.py", "line": 3,
                               "symbol": "greet"}),
        tool_call("r", "lsp", {"action": "references", "file": "a.py", "line": 1,
                               "symbol": "greet"}),
        tool_call("g", "lsp", {"action": "diagnostics", "file": "b.py"})),
        text_reply("Looked.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(project, isolated_agent_dir, script, args=LSP_ARGS) as agent:
            await agent.send("prompt", message="Look", id="p1")
            frames = await agent.until_settled()
            servers = pylsp_children(agent.pid)
            assert len(servers) == 1
    assert_tool_calls_paired(frames)
    got = results(frames)
    assert not any(r["isError"] for r in got.values()), got
    assert tool_result_text(got["d"]) == "1 definition(s):\na.py:1:5: def greet(name):"
    references = tool_result_text(got["r"])
    assert references.startswith("4 reference(s):\n"), references
    for place in ("a.py:1:5:", "a.py:6:11:", "b.py:1:15:", "b.py:3:1:"):
        assert place in references
    assert tool_result_text(got["g"]) == (
        "1 problem(s) in b.py (pylsp):\n"
        "b.py:4:7: error: undefined name 'undefined_name' [pyflakes]")
    # The session ended with the process: its language server with it.
    assert not procfs.alive(servers[0])


async def test_rename_shows_the_edits_then_writes_them(project: Path,
                                                       isolated_agent_dir: Path) -> None:
    rename = {"action": "rename", "file": "a.py", "line": 1, "symbol": "greet",
              "new_name": "salute"}
    script = [tools_reply(tool_call("show", "lsp", rename)),
              tools_reply(tool_call("write", "lsp", {**rename, "apply": True})),
              tools_reply(tool_call("after", "lsp", {"action": "references", "file": "b.py",
                                                     "line": 3, "symbol": "salute"})),
              text_reply("Renamed.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(project, isolated_agent_dir, script, args=LSP_ARGS) as agent:
            await agent.send("prompt", message="Rename", id="p1")
            await agent.until(lambda f: f["type"] == "tool_execution_end"
                              and f["toolCallId"] == "show")
            # Shown, not written.
            assert (project / "a.py").read_text() == A_PY
            assert (project / "b.py").read_text() == B_PY
            await agent.until_settled()
    got = results(agent.frames)
    assert not any(r["isError"] for r in got.values()), got
    shown = tool_result_text(got["show"])
    assert shown.startswith("Rename to salute would change 4 line(s) in 2 file(s); nothing "
                            "was written"), shown
    assert "-from a import greet\n+from a import salute" in shown
    assert tool_result_text(got["write"]) == "Renamed to salute:\na.py: 1 edit\nb.py: 1 edit"
    assert (project / "a.py").read_text() == A_PY.replace("greet", "salute")
    assert (project / "b.py").read_text() == B_PY.replace("greet", "salute")
    assert tool_result_text(got["after"]).startswith("4 reference(s):")


async def test_no_server_on_path_is_a_clear_error(project: Path, isolated_agent_dir: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", str(project / "no-such-dir"))
    script = [tools_reply(tool_call("d", "lsp", {"action": "definition", "file": "b.py",
                                                 "line": 3, "symbol": "greet"})),
              text_reply("No server.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(project, isolated_agent_dir, script, args=LSP_ARGS) as agent:
            await agent.send("prompt", message="Look", id="p1")
            frames = await agent.until_settled()
    result = results(frames)["d"]
    assert result["isError"]
    assert tool_result_text(result) == (
        "No language server for python was found: looked on PATH for `pylsp`, "
        "`pyright-langserver --stdio`, `basedpyright-langserver --stdio`. Install one, or set "
        "lsp.servers.python.command in config.yml.")


async def test_lsp_is_off_by_default_and_on_with_the_setting(project: Path,
                                                             isolated_agent_dir: Path) -> None:
    script = [text_reply("One.")]
    offered = []
    with trio.fail_after(TEST_TIMEOUT):
        for step in ("default", "project", "global"):
            if step == "project":  # a project cannot turn it on for itself
                (project / ".omp").mkdir()
                (project / ".omp" / "config.yml").write_text("lsp:\n  enabled: true\n")
            if step == "global":  # the user's own file can
                (isolated_agent_dir / "config.yml").write_text("lsp:\n  enabled: true\n")
            async with open_agent(project, isolated_agent_dir, script) as agent:
                await agent.send("prompt", message="Hi", id="p1")
                await agent.until_settled()
                offered.append(tool_names(agent.fake.requests[0]))
    assert "read" in offered[0]
    assert ["lsp" in names for names in offered] == [False, False, True]


async def test_a_crashed_server_is_started_again_by_the_next_call(
        project: Path, isolated_agent_dir: Path) -> None:
    definition = {"action": "definition", "file": "b.py", "line": 3, "symbol": "greet"}
    script = [tools_reply(tool_call("before", "lsp", definition)),
              # Holds the run until the test has killed the server.
              tools_reply(tool_call("gate", "bash", {
                  "command": "while [ ! -e killed ]; do sleep 0.02; done"})),
              tools_reply(tool_call("after", "lsp", definition)),
              text_reply("Again.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(project, isolated_agent_dir, script,
                              args=(*FAKE_ARGS, "--tools", "bash,lsp")) as agent:
            await agent.send("prompt", message="Look", id="p1")
            await agent.until(lambda f: f["type"] == "tool_execution_end"
                              and f["toolCallId"] == "before")
            (first,) = pylsp_children(agent.pid)
            os.kill(first, signal.SIGKILL)
            await wait_until_gone(first)
            (project / "killed").touch()
            await agent.until_settled()
            (second,) = pylsp_children(agent.pid)
    got = results(agent.frames)
    assert not any(r["isError"] for r in got.values()), got
    assert tool_result_text(got["after"]) == tool_result_text(got["before"])
    assert second != first


async def test_a_server_that_dies_at_its_start_is_a_clear_error(
        project: Path, isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "config.yml").write_text(
        "lsp:\n  servers:\n    python:\n      command: 'false'\n")
    script = [tools_reply(tool_call("d", "lsp", {"action": "hover", "file": "a.py",
                                                 "line": 1})),
              text_reply("Failed.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(project, isolated_agent_dir, script, args=LSP_ARGS) as agent:
            await agent.send("prompt", message="Look", id="p1")
            frames = await agent.until_settled()
    result = results(frames)["d"]
    assert result["isError"]
    assert tool_result_text(result) == ("The language server stopped: false exited with "
                                        "status 1. The next call starts it again.")


def test_without_lsprotocol_the_tool_says_what_to_install(
        monkeypatch: pytest.MonkeyPatch) -> None:
    import importlib.util

    from omp.tools import missing_dependency

    assert missing_dependency("lsp") is None
    found = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "lsprotocol" else found(name, *a))
    assert missing_dependency("lsp") == (
        "lsp needs the lsp extra (lsprotocol), which is not installed: pip install "
        "'omp-trio[lsp]'")


def test_only_an_applied_rename_writes_and_runs_alone() -> None:
    from omp.tools.base import concurrency_of, tier_of
    from omp.tools.specs import ON_REQUEST_SPECS

    spec = ON_REQUEST_SPECS["lsp"]
    calls: list[dict[str, Any]] = [{"action": "rename", "apply": True}, {"action": "rename"},
             {"action": "rename", "apply": False}, {"action": "references"}]
    assert [concurrency_of(spec.concurrency, c) for c in calls] == [
        "exclusive", "shared", "shared", "shared"]
    assert [tier_of(spec.approval, c) for c in calls] == ["write", "read", "read", "read"]


async def test_a_server_that_never_answers_initialize_is_ended(
        project: Path, isolated_agent_dir: Path) -> None:
    # `sleep` reads nothing and answers nothing: the start's deadline (1 s here) ends it.
    (isolated_agent_dir / "config.yml").write_text(
        "lsp:\n  startTimeoutSeconds: 1\n  servers:\n    python:\n      command: sleep\n"
        "      args: ['600']\n")
    script = [tools_reply(tool_call("d", "lsp", {"action": "symbols", "file": "a.py"})),
              text_reply("Failed.")]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(project, isolated_agent_dir, script, args=LSP_ARGS) as agent:
            await agent.send("prompt", message="Look", id="p1")
            frames = await agent.until_settled()
            left = [pid for pid in procfs.children(agent.pid)
                    if procfs.cmdline(pid).endswith(b"sleep\x00600\x00")]
    result = results(frames)["d"]
    assert result["isError"]
    assert tool_result_text(result) == (
        "The language server stopped: sleep did not answer initialize within 1 s "
        "(lsp.startTimeoutSeconds). The next call starts it again.")
    assert left == []


async def test_a_sync_cancelled_before_it_is_written_is_sent_by_the_next(tmp_path: Path) -> None:
    """``Connection.sync`` records a text as the server's only once it is written: cancelled
    while it waits to write (another message is being written), the server never got it, so
    the next ``sync`` of that text sends it (``didOpen``, version 1)."""
    source = tmp_path / "a.py"
    source.write_text(A_PY)
    spec = ServerSpec(language="python", argv=(str(BIN / "pylsp"),), root=tmp_path,
                      language_id="python", env=dict(os.environ))
    with trio.fail_after(TEST_TIMEOUT):
        async with trio.open_nursery() as nursery:
            connection = await nursery.start(serve_server, spec)
            written = trio.Event()

            async def write_something(*, task_status: trio.TaskStatus[None]) -> None:
                # Holds the lock as a message being written does: the sync waits for it.
                async with connection._write_lock:
                    task_status.started()
                    await written.wait()

            await nursery.start(write_something)
            with trio.CancelScope() as scope:
                async def cancel_once_waiting() -> None:
                    await trio.testing.wait_all_tasks_blocked()
                    scope.cancel()

                nursery.start_soon(cancel_once_waiting)
                await connection.sync(source, A_PY)
            written.set()
            assert scope.cancelled_caught
            assert uri_of(source) not in connection.documents
            assert await connection.sync(source, A_PY) is True
            assert connection.documents[uri_of(source)].version == 1
            connection.stop()
