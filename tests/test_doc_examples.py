"""Every Python example in README.md and docs/ runs, so none can rot.

Each fenced ```` ```python ```` block is one example. The HTML comment on the line before its
fence (invisible on a rendered page) says how it is checked:

* none: a program. It runs in its own ``python`` process, in an empty directory, with the
  test's agent directory and no provider keys (so on the offline model) and stdin at EOF; a
  top-level ``await`` / ``async with`` runs inside ``trio.run``. It must exit 0 within
  ``EXAMPLE_TIMEOUT`` seconds (an example that waits for an event that never comes fails).
* ``<!-- example: extension registers COMMAND -->``: an extension module. It is loaded by a
  real ``omp --mode rpc -e FILE`` and must load without an error and register ``COMMAND``.
* ``<!-- example: pytest -->``: a test module of a host's project. The docs' test modules run
  together, one ``python -m pytest`` in an otherwise empty directory (no ``conftest.py``: the
  fixtures come from the installed ``omp.testing`` plugin), and every test in each must pass.
* ``<!-- example: fragment: REASON -->``: not runnable on its own (a piece of a larger program,
  a placeholder to fill in); the REASON is required and shown as the skip reason.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import attrs
import pytest
import trio

from omp.client import Event, RpcClient
from omp.protocol import commands as cmd
from omp.protocol.payloads import AvailableCommandsPayload

ROOT = Path(__file__).resolve().parent.parent
EXAMPLE_TIMEOUT = 90

FENCE = re.compile(r"^```python[ \t]*\n(.*?)^```[ \t]*$", re.M | re.S)
MARK = re.compile(r"<!--\s*example:\s*(.*?)\s*-->")

# Runs one example: top-level await (PyCF_ALLOW_TOP_LEVEL_AWAIT) makes the code object a
# coroutine function body, run with trio; otherwise it is plain module code.
RUNNER = """
import ast, inspect, sys, trio
source = open(sys.argv[1]).read()
code = compile(source, sys.argv[1], "exec", flags=ast.PyCF_ALLOW_TOP_LEVEL_AWAIT)
namespace = {"__name__": "__main__"}
if code.co_flags & inspect.CO_COROUTINE:
    async def main():
        await eval(code, namespace)
    trio.run(main)
else:
    exec(code, namespace)
"""


@attrs.frozen
class Example:
    path: Path
    line: int
    source: str
    mark: str
    """The ``example:`` comment's text, ``""`` when there is none."""

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def examples() -> list[Example]:
    found = []
    for path in [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]:
        text = path.read_text()
        for match in FENCE.finditer(text):
            line = text.count("\n", 0, match.start()) + 1
            before = text[:match.start()].rstrip("\n").rsplit("\n", 1)[-1]
            mark = MARK.search(before)
            found.append(Example(path, line, match.group(1), mark.group(1) if mark else ""))
    return found


EXAMPLES = examples()


def test_the_examples_are_found() -> None:
    assert len(EXAMPLES) >= 5, [e.id for e in EXAMPLES]
    readme = [e for e in EXAMPLES if e.path.name == "README.md"]
    assert any(not e.mark for e in readme), "no runnable example in README.md"


@pytest.mark.parametrize("example", [e for e in EXAMPLES if e.mark != "pytest"],
                         ids=lambda e: e.id)
async def test_example_runs(example: Example, tmp_path: Path, isolated_agent_dir: Path) -> None:
    if example.mark.startswith("fragment"):
        reason = example.mark.removeprefix("fragment").strip(" :")
        assert reason, f"{example.id}: a fragment must say why it cannot run"
        pytest.skip(f"fragment: {reason}")
    if example.mark.startswith("extension"):
        await _check_extension(example, tmp_path)
        return
    assert not example.mark, f"{example.id}: unknown example mark {example.mark!r}"
    script = tmp_path / "example.py"
    script.write_text(example.source)
    work = tmp_path / "work"
    work.mkdir()
    env = {**os.environ, "TMPDIR": str(tmp_path)}
    with trio.fail_after(EXAMPLE_TIMEOUT):
        done = await trio.run_process(
            [sys.executable, "-c", RUNNER, str(script)], cwd=work, env=env,
            stdin=subprocess.DEVNULL, capture_stdout=True, capture_stderr=True, check=False)
    assert done.returncode == 0, (
        f"{example.id} exited {done.returncode}:\n{done.stderr.decode(errors='replace')}")


async def test_the_pytest_examples_pass(tmp_path: Path, isolated_agent_dir: Path) -> None:
    """The ``pytest`` examples, each a module of one project run by one ``python -m pytest``
    (a pytest with every plugin takes seconds to start: once, not once per example). Every
    module must be collected, and every test in it pass; the output names the example's file
    and line in the module's name."""
    chosen = [e for e in EXAMPLES if e.mark == "pytest"]
    assert chosen, "no pytest example in the docs"
    project = tmp_path / "project"
    project.mkdir()
    names = {}
    for example in chosen:
        stem = re.sub(r"\W", "_", f"{example.path.relative_to(ROOT).with_suffix('')}")
        name = f"test_{stem}_{example.line}.py"
        (project / name).write_text(example.source)
        names[name] = example.id
    env = {k: v for k, v in os.environ.items() if not k.startswith("PYTEST")}
    env["TMPDIR"] = str(tmp_path)
    with trio.fail_after(EXAMPLE_TIMEOUT * len(chosen)):
        done = await trio.run_process(
            [sys.executable, "-m", "pytest", "-q", "-rA", "-p", "no:cacheprovider", *names],
            cwd=project, env=env, stdin=subprocess.DEVNULL,
            capture_stdout=True, capture_stderr=True, check=False)
    output = (done.stdout + done.stderr).decode(errors="replace")
    assert done.returncode == 0, f"the examples' tests failed:\n{output}"
    passed = {line.split()[1].split("::")[0] for line in output.splitlines()
              if line.startswith("PASSED ")}
    assert passed == set(names), (
        f"examples without a passing test: {[names[n] for n in set(names) - passed]}\n{output}")


async def _check_extension(example: Example, tmp_path: Path) -> None:
    match = re.fullmatch(r"extension registers (\S+)", example.mark)
    assert match, f"{example.id}: write <!-- example: extension registers COMMAND -->"
    extension = tmp_path / "example_extension.py"
    extension.write_text(example.source)
    work = tmp_path / "work"
    work.mkdir()
    with trio.fail_after(EXAMPLE_TIMEOUT):
        listed, errors = await _load(extension, work)
    assert not errors, errors
    assert match.group(1) in [c.name for c in listed.commands], listed


async def _load(extension: Path, work: Path) -> tuple[AvailableCommandsPayload, list[Event]]:
    """The commands a server with ``extension`` lists, and the extension errors it reported
    before it answered."""
    async with RpcClient.spawn(
            args=("--mode", "rpc", "--model", "offline/echo", "--no-session",
                  "-e", str(extension)), cwd=work) as client:
        listed = await client.call(cmd.GetAvailableCommands(), AvailableCommandsPayload)
        errors = []
        while True:
            try:
                event = client.events.receive_nowait()
            except trio.WouldBlock:
                break
            if event.type == "extension_error":
                errors.append(event)
    return listed, errors
