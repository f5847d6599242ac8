"""glob, ast_grep and ast_edit (issue 34): through the real ``omp --mode rpc`` process against
the fake LLM, and their pure parts (``omp.tools.glob``, ``omp.tools.ast_engine``).

The AST tools need ast-grep's bindings (the ``ast`` extra, in ``test``); a test that imports
them skips, saying so, where they are missing, except the one that checks what a launch says
then (it hides them itself).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path, PurePath
from typing import Any

import procfs
import pytest
import trio
from agent_helpers import (
    FAKE_ARGS,
    Frame,
    assert_tool_calls_paired,
    fake_provider,
    of_type,
    open_agent,
    text_reply,
    tool_call,
    tool_result_text,
    tools_reply,
)

from omp.protocol.messages import TextContent
from omp.tools import default_tools, missing_dependency
from omp.tools.base import ToolContext, ToolError, ToolResult
from omp.tools.glob import collect_files, split_entries, split_glob

TEST_TIMEOUT = 60
needs_ast_grep = pytest.mark.skipif(
    missing_dependency("ast_grep") is not None,
    reason="ast-grep-py is not installed (pip install 'omp-trio[ast]')")


def results(frames: list[Frame]) -> dict[str, dict[str, Any]]:
    """The toolResult messages by call id."""
    return {f["message"]["toolCallId"]: f["message"] for f in of_type(frames, "message_end")
            if f["message"]["role"] == "toolResult"}


def offered(agent_fake: Any) -> list[str]:
    """The tool names of the first model request."""
    return [t["function"]["name"] for t in agent_fake.requests[0].json()["tools"]]


async def run(cwd: Path, agent_dir: Path, calls: list[dict[str, Any]], *,
              tools: str | None = None) -> tuple[list[Frame], Any]:
    """One prompt whose model makes ``calls`` one message after another, then says done."""
    script = [tools_reply(call) for call in calls] + [text_reply("done")]
    args = [*FAKE_ARGS, *(["--tools", tools] if tools is not None else [])]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(cwd, agent_dir, script, args=args) as agent:
            await agent.send("prompt", message="go")
            frames = await agent.until_settled()
    assert_tool_calls_paired(frames)
    return frames, agent.fake


@pytest.fixture
def repo(tmp_path: Path) -> Path:
    """A small project (the cwd of the process), apart from the agent dir."""
    root = tmp_path / "repo"
    (root / "src" / "pkg").mkdir(parents=True)
    (root / "tests").mkdir()
    (root / "src" / "main.py").write_text(
        'f(1)\nmessage = "f(2) is only text"\n# f(3) in a comment\ng(f(4))\n')
    (root / "src" / "pkg" / "util.py").write_text("def f(x):\n    return x\n")
    (root / "src" / "notes.txt").write_text("f(5)\n")
    (root / "tests" / "test_main.py").write_text("f(6)\n")
    (root / ".gitignore").write_text("build/\n")
    (root / "build").mkdir()
    (root / "build" / "gen.py").write_text("f(7)\n")
    # ripgrep reads .gitignore inside a git repository only.
    subprocess.run(["git", "init", "-q", str(root)], check=True)
    return root


# --- glob ----------------------------------------------------------------------------------


async def test_glob_is_offered_by_default_and_finds_python_files(
        repo: Path, isolated_agent_dir: Path) -> None:
    frames, fake = await run(repo, isolated_agent_dir, [
        tool_call("g", "glob", {"path": "src/**/*.py"}),
        tool_call("h", "glob", {"path": "*.py; nope"}),
    ])
    names = offered(fake)
    assert "glob" in names
    # find, ast_grep and ast_edit are offered only on request, as in the original.
    assert not {"find", "ast_grep", "ast_edit"} & set(names)
    found = results(frames)
    assert tool_result_text(found["g"]) == "src/main.py\nsrc/pkg/util.py"
    # A glob without "/" matches at any depth; .gitignore'd build/ is left out; a missing
    # entry among others is named, not fatal.
    assert tool_result_text(found["h"]) == (
        "src/main.py\nsrc/pkg/util.py\ntests/test_main.py\n\n[Skipped missing paths: nope]")


async def test_find_and_glob_both_work_with_tools(repo: Path, isolated_agent_dir: Path) -> None:
    # Each name is offered with its own schema: find is pi's ({pattern, path}), glob the
    # original's ({path}); the listing behind them is one.
    frames, fake = await run(repo, isolated_agent_dir, [
        tool_call("f", "find", {"pattern": "*.py", "path": "src"}),
        tool_call("g", "glob", {"path": "src"}),
    ], tools="find,glob")
    assert offered(fake) == ["find", "glob"]
    found = results(frames)
    assert tool_result_text(found["f"]) == "main.py\npkg/util.py"
    assert tool_result_text(found["g"]) == ("src/main.py\nsrc/notes.txt\nsrc/pkg/\n"
                                            "src/pkg/util.py")


async def test_glob_options(repo: Path) -> None:
    (repo / ".hidden.py").write_text("")
    ctx = ToolContext(repo)
    glob = {t.name: t for t in default_tools(ctx)}["glob"]

    async def listing(args: dict[str, Any]) -> str:
        result: ToolResult = await glob.execute("c", args, on_update=_ignore)
        block = result.content[0]
        assert isinstance(block, TextContent)
        return block.text

    assert await listing({"path": "*.py"}) == (
        ".hidden.py\nsrc/main.py\nsrc/pkg/util.py\ntests/test_main.py")
    assert ".hidden.py" not in await listing({"path": "*.py", "hidden": False})
    assert "build/gen.py" in await listing({"path": "*.py", "gitignore": False})
    assert await listing({"path": "src/*.py"}) == "src/main.py"  # only src's own files
    assert await listing({"path": "src/main.py"}) == "src/main.py"
    assert (await listing({"path": "*.py", "limit": 1})).startswith(
        ".hidden.py\n\n[1 results limit reached. Use limit=2 for more")
    with pytest.raises(ToolError, match="Path not found: nope"):
        await listing({"path": "nope"})
    with pytest.raises(ToolError, match="root directory is not allowed"):
        await listing({"path": "/*.py"})
    with pytest.raises(ToolError, match="Not a directory"):
        await listing({"path": "src/main.py/*.py"})


async def _ignore(*_: Any) -> None:
    pass


def test_split_entries_and_globs() -> None:
    assert split_entries(None) == split_entries("") == split_entries(" ; ") == ["."]
    assert split_entries("src; tests ;") == ["src", "tests"]
    assert split_glob("src/**/*.py") == ("src", "**/*.py")
    assert split_glob("*.md") == (".", "*.md")
    assert split_glob("*/x.py") == (".", "*/x.py")
    assert split_glob("docs") == ("docs", None)
    assert split_glob("/abs/dir/{a,b}.ts") == ("/abs/dir", "{a,b}.ts")
    assert split_glob("/*.py") == ("/", "*.py")


async def test_collect_files_lists_each_file_once(repo: Path) -> None:
    found = await collect_files(ToolContext(repo), "src; src/main.py; src/**/*.py", limit=100)
    assert [p.relative_to(repo).as_posix() for p in found.paths] == [
        "src/main.py", "src/notes.txt", "src/pkg/util.py"]
    assert found.named == {repo / "src" / "main.py"}


# --- ast_grep ------------------------------------------------------------------------------


@needs_ast_grep
async def test_ast_grep_finds_calls_not_text(repo: Path, isolated_agent_dir: Path) -> None:
    frames, fake = await run(repo, isolated_agent_dir, [
        tool_call("a", "ast_grep", {"pat": "f($A)", "path": "src"}),
        tool_call("b", "ast_grep", {"pat": "f($A)", "path": "src/notes.txt", "lang": "py"}),
    ], tools="read,ast_grep")
    assert offered(fake) == ["read", "ast_grep"]
    found = results(frames)
    # f(2) in a string and f(3) in a comment are text, not calls; notes.txt is no Python
    # file unless named with a language.
    assert tool_result_text(found["a"]) == (
        "src/main.py\n  1: f(1)\n      $A = 1\n  4: f(4)\n      $A = 4")
    assert [(m["line"], m["metaVariables"]) for m in found["a"]["details"]["matches"]] == [
        (1, {"A": "1"}), (4, {"A": "4"})]
    assert tool_result_text(found["b"]) == "src/notes.txt\n  1: f(5)\n      $A = 5"


@needs_ast_grep
async def test_ast_grep_pages_with_skip(repo: Path, isolated_agent_dir: Path) -> None:
    (repo / "many.py").write_text("".join(f"f({i})\n" for i in range(60)))
    frames, _ = await run(repo, isolated_agent_dir, [
        tool_call("p1", "ast_grep", {"pat": "f($$$ARGS)", "path": "many.py"}),
        tool_call("p2", "ast_grep", {"pat": "f($$$ARGS)", "path": "many.py", "skip": 50}),
        tool_call("p3", "ast_grep", {"pat": "f($$$ARGS)", "path": "many.py", "skip": 60}),
    ], tools="ast_grep")
    found = results(frames)
    first = tool_result_text(found["p1"])
    assert "  50: f(49)" in first
    assert "f(50)" not in first
    assert first.endswith("[Matches 1-50 of 60 in 1 files. Use skip=50 for more]")
    second = tool_result_text(found["p2"])
    assert second.startswith("many.py\n  51: f(50)\n      $ARGS = 50")
    assert "  60: f(59)" in second
    assert "skip=" not in second
    assert found["p2"]["details"]["matchCount"] == 60
    assert tool_result_text(found["p3"]) == "No matches after skip=60 (there are 60)"


@needs_ast_grep
async def test_ast_grep_errors(repo: Path) -> None:
    tools = {t.name: t for t in default_tools(ToolContext(repo), enable={"ast_grep"})}

    async def call(args: dict[str, Any]) -> str:
        result = await tools["ast_grep"].execute("c", args, on_update=_ignore)
        block = result.content[0]
        assert isinstance(block, TextContent)
        return block.text

    with pytest.raises(ToolError, match="Unknown language: 'cobol'"):
        await call({"pat": "f($A)", "lang": "cobol"})
    with pytest.raises(ToolError, match="not valid python"):
        await call({"pat": "$$$", "path": "src"})
    with pytest.raises(ToolError, match=r"Cannot tell the language of .*notes\.txt: give lang"):
        await call({"pat": "f($A)", "path": "src/notes.txt"})
    with pytest.raises(ToolError, match="pat must be a non-empty pattern"):
        await call({"pat": "  "})
    (repo / "broken.py").write_text("f(8)\ndef (:\n")
    text = await call({"pat": "f($A)", "path": "broken.py"})
    assert "[Parse errors in broken.py: matches there may be missing]" in text


# --- ast_edit ------------------------------------------------------------------------------


@needs_ast_grep
async def test_ast_edit_rewrites_all_or_nothing(repo: Path, isolated_agent_dir: Path) -> None:
    outside = repo.parent / "outside.py"
    outside.write_text("f(9)\n")
    main = repo / "src" / "main.py"
    frames, _ = await run(repo, isolated_agent_dir, [
        tool_call("ok", "ast_edit", {"ops": [{"pat": "f($A)", "out": "call($A, 0)"}],
                                     "paths": ["src/**/*.py", "tests"]}),
        # The second op would leave invalid Python: neither op is applied anywhere.
        tool_call("bad", "ast_edit", {"ops": [{"pat": "call($A, 0)", "out": "h($A)"},
                                              {"pat": "g($X)", "out": "g($X"}],
                                      "paths": ["src"]}),
        tool_call("out", "ast_edit", {"ops": [{"pat": "f($A)", "out": "g($A)"}],
                                      "paths": ["../outside.py"]}),
        tool_call("var", "ast_edit", {"ops": [{"pat": "f($A)", "out": "g($B)"}],
                                      "paths": ["src"]}),
    ], tools="ast_edit")
    found = results(frames)
    assert tool_result_text(found["ok"]) == (
        "Replaced 3 matches in 2 files:\n  src/main.py: 2\n  tests/test_main.py: 1")
    after = ('call(1, 0)\nmessage = "f(2) is only text"\n# f(3) in a comment\n'
             'g(call(4, 0))\n')
    assert found["ok"]["isError"] is False
    assert found["ok"]["details"]["files"][0]["diff"]
    assert main.read_text() == after
    assert (repo / "tests" / "test_main.py").read_text() == "call(6, 0)\n"
    assert found["bad"]["isError"] is True
    assert "would leave invalid python" in tool_result_text(found["bad"])
    assert "No file was changed" in tool_result_text(found["bad"])
    assert main.read_text() == after
    assert found["out"]["isError"] is True
    assert "outside the workspace" in tool_result_text(found["out"])
    assert outside.read_text() == "f(9)\n"
    assert found["var"]["isError"] is True
    assert tool_result_text(found["var"]) == (
        "ops[0]: out uses $B, which the pattern 'f($A)' does not capture")
    # No temporary file was left beside the files rewritten.
    assert sorted(p.name for p in (repo / "src").iterdir()) == ["main.py", "notes.txt", "pkg"]


@needs_ast_grep
async def test_ast_edit_keeps_a_files_mode_and_refuses_a_fifo(repo: Path) -> None:
    tools = {t.name: t for t in default_tools(ToolContext(repo), enable={"ast_edit"})}
    script = repo / "run.py"
    script.write_text("f(1)\n")
    script.chmod(0o750)
    await tools["ast_edit"].execute("c", {"ops": [{"pat": "f($A)", "out": "g($A)"}],
                                          "paths": ["run.py"]}, on_update=_ignore)
    assert script.read_text() == "g(1)\n"
    assert script.stat().st_mode & 0o777 == 0o750
    os.mkfifo(repo / "pipe.py")
    with pytest.raises(ToolError, match=r"Cannot rewrite .*pipe\.py: .*FIFO"):
        await tools["ast_edit"].execute("c", {"ops": [{"pat": "f($A)", "out": "g($A)"}],
                                              "paths": ["pipe.py"]}, on_update=_ignore)


@needs_ast_grep
async def test_abort_kills_the_worker(tmp_path: Path, isolated_agent_dir: Path) -> None:
    # 60 MB of Python keeps the worker parsing for many seconds (more on a loaded machine):
    # long after the test has seen it and sent the abort.
    big = tmp_path / "big"
    big.mkdir()
    for n in range(40):
        (big / f"m{n}.py").write_text("f(1)\n" * 300_000)
    script = [tools_reply(tool_call("a", "ast_grep", {"pat": "f($A)", "path": "big"}))]
    with trio.fail_after(TEST_TIMEOUT):
        async with open_agent(tmp_path, isolated_agent_dir, script,
                              args=[*FAKE_ARGS, "--tools", "ast_grep"]) as agent:
            await agent.send("prompt", message="go", id="p1")
            # No event says the worker started: /proc is polled.
            while not (workers := [pid for pid in procfs.children(agent.pid)  # noqa: ASYNC110
                                   if b"omp.tools.ast_worker" in procfs.cmdline(pid)]):
                await trio.sleep(0.02)  # the poll's pace, not a wait for time
            abort_id = await agent.send("abort")
            await agent.until_response(abort_id)  # written once the run has ended
            assert not any(procfs.alive(pid) for pid in workers)
            assert procfs.children(agent.pid) == []
            frames = agent.frames
    assert_tool_calls_paired(frames)
    (end,) = of_type(frames, "tool_execution_end")
    assert end["isError"] is True
    assert "aborted" in tool_result_text(end["result"]).lower()


# --- off by default, on with a setting or --tools -------------------------------------------


@needs_ast_grep
async def test_settings_turn_the_ast_tools_on(repo: Path, isolated_agent_dir: Path) -> None:
    (isolated_agent_dir / "config.yml").write_text(
        "astGrep: {enabled: true}\nastEdit: {enabled: true}\n")
    _, fake = await run(repo, isolated_agent_dir, [])
    assert {"ast_grep", "ast_edit"} <= set(offered(fake))
    (isolated_agent_dir / "config.yml").write_text("astGrep: {enabled: true}\n"
                                                   "astEdit: {enabled: false}\n")
    _, fake = await run(repo, isolated_agent_dir, [], tools="read,ast_grep,ast_edit")
    assert offered(fake) == ["read", "ast_grep"]  # false wins over --tools, as for any tool


async def test_without_ast_grep_py_the_tools_say_what_to_install(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # sitecustomize runs at interpreter start: a None in sys.modules makes the bindings
    # unfindable (importlib.util.find_spec answers None), as on a machine without them.
    shim = tmp_path / "shim"
    shim.mkdir()
    (shim / "sitecustomize.py").write_text("import sys\nsys.modules['ast_grep_py'] = None\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(
        [str(shim), *filter(None, [os.environ.get("PYTHONPATH")])])}
    (isolated_agent_dir / "config.yml").write_text("astGrep: {enabled: true}\n")
    async with fake_provider([text_reply("ok")], isolated_agent_dir) as fake:
        with trio.fail_after(TEST_TIMEOUT):
            refused = await trio.run_process(
                [sys.executable, "-m", "omp", "--model", "fake/fake-model", "--no-session",
                 "--tools", "read,ast_grep", "-p", "hi"], cwd=tmp_path, env=env,
                capture_stdout=True, capture_stderr=True, check=False)
            plain = await trio.run_process(
                [sys.executable, "-m", "omp", "--model", "fake/fake-model", "--no-session",
                 "-p", "hi"], cwd=tmp_path, env=env, capture_stdout=True,
                capture_stderr=True, check=False)
        names = [t["function"]["name"] for t in fake.requests[0].json()["tools"]]
    assert refused.returncode == 1
    assert refused.stderr.decode().strip() == (
        "omp: ast_grep needs ast-grep's Python bindings, which are not installed: "
        "pip install 'omp-trio[ast]' (or ast-grep-py)")
    assert plain.returncode == 0, plain.stderr
    assert "omp: not offered: ast_grep needs ast-grep's Python bindings" in plain.stderr.decode()
    assert "ast_grep" not in names


# --- the pure parts ------------------------------------------------------------------------


def test_languages() -> None:
    from omp.tools.ast_engine import PatternError, infer_language, language, searched_with

    assert language("py") == language("Python") == "python"
    assert language("ts") == "typescript"
    assert language("c++") == "cpp"
    with pytest.raises(PatternError, match="Unknown language: 'angular'"):
        language("angular")
    assert infer_language(PurePath("a/b.PY")) == "python"
    assert infer_language(PurePath("x.tsx")) == "tsx"
    assert infer_language(PurePath("x")) is None
    assert searched_with(PurePath("x.h"), "cpp")
    assert searched_with(PurePath("x.h"), "c")
    assert not searched_with(PurePath("x.py"), "cpp")


def test_metavariables_and_templates() -> None:
    from omp.tools.ast_engine import (
        Metavariable,
        PatternError,
        check_template,
        choose_languages,
        expand,
        metavariables,
    )

    assert metavariables("f($A, $$$REST, $_, $_X, $A)") == [
        Metavariable("A", False), Metavariable("REST", True)]
    assert metavariables("$lower + $$B") == [Metavariable("B", False)]
    check_template("g($A, $$$REST)", "f($A, $$$REST)")
    with pytest.raises(PatternError, match=r"out uses \$B"):
        check_template("g($B)", "f($A)")
    assert expand("g($$$REST)[$A] $x", {"A": "1", "REST": "a, b"}) == "g(a, b)[1] $x"
    a, b, c = PurePath("a.py"), PurePath("b.txt"), PurePath("c.h")
    assert choose_languages([a, b, c], [b], None) == ([(a, "python"), (c, "c")], [b])
    assert choose_languages([a, b, c], [b], "cpp") == ([(b, "cpp"), (c, "cpp")], [])


@needs_ast_grep
def test_search_and_rewrite() -> None:
    from omp.tools.ast_engine import PatternError, rewrite, search

    source = 's = "é f(0)"\nf(a, b)\nf(f(1))\n'
    found = search(source, "python", "f($$$ARGS)")
    assert [(m.line, m.column, m.text, m.captured) for m in found.matches] == [
        (2, 1, "f(a, b)", {"ARGS": "a, b"}), (3, 1, "f(f(1))", {"ARGS": "f(1)"}),
        (3, 3, "f(1)", {"ARGS": "1"})]
    assert not found.parse_error
    # A match inside another is left to the outer one's replacement.
    done = rewrite(source, "python", "f($$$ARGS)", "g($$$ARGS)")
    assert (done.text, done.count) == ('s = "é f(0)"\ng(a, b)\ng(f(1))\n', 2)
    assert rewrite(source, "python", "f($$$ARGS)", "").text == 's = "é f(0)"\n\n\n'
    with pytest.raises(PatternError, match="would leave invalid python"):
        rewrite(source, "python", "f($A, $B)", "f($A,")
    with pytest.raises(PatternError, match="is not valid python"):
        rewrite(source, "python", "$$$", "x")
    assert rewrite(source, "python", "nothing($A)", "x").count == 0


def test_the_ast_tools_are_not_imported_before_use() -> None:
    # Offering the tools costs nothing: the bindings load on the first call.
    code = ("import sys\nfrom pathlib import Path\nfrom omp.tools import default_tools\n"
            "from omp.tools.base import ToolContext\n"
            "tools = default_tools(ToolContext(Path('.')), enable={'ast_grep', 'ast_edit'})\n"
            "print([t.name for t in tools][-2:], 'ast_grep_py' in sys.modules,"
            " 'omp.tools.ast_grep' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                          check=True)
    expected = (["ast_grep", "ast_edit"] if missing_dependency("ast_grep") is None else [])
    assert done.stdout.strip() == f"{expected if expected else ['ls', 'todo']} False False"


@needs_ast_grep
def test_a_page_spans_files(tmp_path: Path) -> None:
    from omp.tools.ast_engine import SearchRequest, search_files

    for name, count in (("a.py", 3), ("b.py", 0), ("c.py", 4)):
        (tmp_path / name).write_text("".join(f"f({name[0]}{i})\n" for i in range(count)))
    jobs = [(str(tmp_path / n), "python") for n in ("a.py", "b.py", "c.py")]
    report = search_files(SearchRequest(jobs, "f($A)", skip=2, page=3))
    assert (report.total, report.files, report.searched) == (7, 2, 3)
    assert [(PurePath(m.path).name, m.found.captured["A"]) for m in report.matches] == [
        ("a.py", "a2"), ("c.py", "c0"), ("c.py", "c1")]
    # A match's text is cut: a pattern like $A matches whole files.
    (tmp_path / "long.py").write_text("x = [" + "1, " * 5000 + "]\n")
    (whole,) = search_files(SearchRequest([(str(tmp_path / "long.py"), "python")],
                                          "x = $V")).matches
    assert len(whole.found.text) == 2001
    assert whole.found.text.endswith("…")


def test_split_and_merge() -> None:
    from omp.tools.ast_engine import (
        FileMatch,
        Found,
        SearchReport,
        merge_searches,
        split_jobs,
    )

    jobs = [(f"{n}.py", "python") for n in range(6)]
    assert split_jobs(jobs, [10, 10, 10, 10, 10, 10], 2) == [jobs[:3], jobs[3:]]
    assert split_jobs(jobs, [50, 1, 1, 1, 1, 1], 2) == [jobs[:1], jobs[1:]]
    assert split_jobs(jobs[:1], [5], 4) == [jobs[:1]]
    assert split_jobs(jobs, [0] * 6, 3) == [jobs[:2], jobs[2:4], jobs[4:]]

    def report(path: str, total: int, first: int) -> SearchReport:
        found = [FileMatch(path, Found(i + 1, 1, "f()", {})) for i in range(min(total, first))]
        return SearchReport(found, total, 1 if total else 0, 1, [], [], {})

    merged = merge_searches([report("a", 3, 4), report("b", 0, 4), report("c", 5, 4)], 2, 2)
    assert [(m.path, m.found.line) for m in merged.matches] == [("a", 3), ("c", 1)]
    assert (merged.total, merged.files, merged.searched) == (8, 2, 3)


@needs_ast_grep
async def test_several_workers_find_what_one_finds(tmp_path: Path) -> None:
    from omp.subprocess_env import DEFAULT_POLICY
    from omp.tools.ast_engine import SearchRequest
    from omp.tools.ast_process import PER_WORKER, run_worker, search

    files = 4 * PER_WORKER
    for n in range(files):
        (tmp_path / f"m{n:03}.py").write_text("".join(f"f({n}, {i})\n" for i in range(n % 7)))
    jobs = [(str(tmp_path / f"m{n:03}.py"), "python") for n in range(files)]
    for skip in (0, 37, 400, 10_000):
        request = SearchRequest(jobs, "f($A, $B)", skip, 50)
        spread = await search(request, cwd=tmp_path, environment=DEFAULT_POLICY)
        alone = await run_worker(request, cwd=tmp_path, environment=DEFAULT_POLICY)
        assert spread == alone, skip
    assert spread.total == sum(n % 7 for n in range(files))


def test_a_file_changed_since_the_plan_is_not_overwritten(tmp_path: Path) -> None:
    import threading

    from omp.tools.ast_edit import apply
    from omp.tools.ast_engine import Change

    planned, changed = tmp_path / "a.py", tmp_path / "b.py"
    planned.write_text("f(1)\n")
    changed.write_text("f(2)\n# edited meanwhile\n")
    changes = [Change(str(planned), "f(1)\n", "g(1)\n", [1]),
               Change(str(changed), "f(2)\n", "g(2)\n", [1])]
    with pytest.raises(ToolError, match=r"b\.py changed while ast_edit ran; it was left as it "
                                        r"is; already rewritten: .*a\.py"):
        apply(changes, threading.Event())
    assert planned.read_text() == "g(1)\n"
    assert changed.read_text() == "f(2)\n# edited meanwhile\n"
