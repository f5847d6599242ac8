"""The shape the code keeps: no class over 500 lines, ``AgentSession`` a thin façade (issue 20),
the modules a plain start must not import before ``ready``, the attrs classes and compiled
patterns it must not create, and the modules an idle server must not hold (``omp.lazy`` says why
each is left to first use; ``bench/bench_rpc.py`` measures what a start costs and what an idle
server holds); and every public async function's docstring saying what cancellation does."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import omp

ROOT = Path(omp.__file__).parent
MAX_CLASS_LINES = 500
MAX_FACADE_LINES = 400


def class_lengths() -> dict[str, int]:
    lengths = {}
    for path in ROOT.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.ClassDef) and node.end_lineno is not None:
                where = f"{path.relative_to(ROOT.parent)}:{node.name}"
                lengths[where] = node.end_lineno - node.lineno + 1
    return lengths


def test_no_class_is_over_500_lines() -> None:
    lengths = class_lengths()
    assert "omp/session/agent_session.py:AgentSession" in lengths  # the walk found the code
    too_long = {name: n for name, n in lengths.items() if n > MAX_CLASS_LINES}
    assert not too_long, f"split these by role: {too_long}"


def test_agent_session_stays_a_facade() -> None:
    n = class_lengths()["omp/session/agent_session.py:AgentSession"]
    assert n <= MAX_FACADE_LINES, (
        f"AgentSession is {n} lines: move a job into one of its parts (store, model control, "
        "run coordinator, maintenance, tool set)")


# Run in a fresh interpreter: this test process has imported everything already.
_PROBE = """
import json, sys, trio, omp

class Snapshot(trio.abc.SendStream):
    # The modules loaded at the moment the first bytes (``ready``) are written.
    def __init__(self):
        self.first = None
        self.modules = None
    async def send_all(self, data):
        if self.first is None:
            self.modules = sorted(sys.modules)
            self.attrs_classes = sorted(
                f"{name}.{key}" for name, module in list(sys.modules.items())
                if name.startswith("omp") for key, value in vars(module).items()
                if isinstance(value, type) and value.__module__ == name
                and hasattr(value, "__attrs_attrs__"))
            self.first = bytes(data).split(b"\\n")[0].decode()
        await trio.lowlevel.checkpoint()
    async def wait_send_all_might_not_block(self):
        await trio.lowlevel.checkpoint()
    async def aclose(self):
        await trio.lowlevel.checkpoint()

async def main():
    to_server, server_in = omp.memory_pipe()
    out = Snapshot()
    options = omp.ServeOptions(persist=False, announce_offline=False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: omp.serve(server_in, out, options=options))
        await to_server.aclose()  # EOF: serve() ends after ready
    print(json.dumps({"first": out.first, "modules": out.modules,
                      "attrs_classes": out.attrs_classes}))

trio.run(main)
"""

NOT_BEFORE_READY = (
    "httpx", "jsonschema", "yaml", "cattrs", "mcp", "html_to_markdown", "importlib.metadata",
    "importlib.resources", "zipfile", "omp.llm.providers", "omp.llm.models_file",
    "omp.llm.local", "omp.session.rules", "omp.session.export_html", "omp.extensions.loader",
    "omp.extensions.jsapi", "omp.extensions.jshost", "omp.mcp.manager", "omp.mcp.connection",
    "omp.tools.web_policy", "omp.tools.read",
    "omp.tools.bash", "omp.tools.web_fetch", "omp.login.flows", "omp.login.oauth",
    "omp.subagents.child", "omp.subagents.progress", "omp.mcp",
    "omp.tools.eval", "omp.tools.eval_kernel", "jupyter_client", "ipykernel", "zmq",
)
"""Modules (packages: their submodules too) a start with no configuration does not need before
``ready``; each is imported where it is first used."""


def start_report(tmp_path: Path) -> dict[str, Any]:
    """What ``_PROBE`` saw when ``ready`` was written."""
    env = {"HOME": str(tmp_path), "OMP_AGENT_DIR": str(tmp_path / "agent"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-P", "-c", _PROBE], cwd=tmp_path, env=env,
                          capture_output=True, timeout=60, check=True)
    report: dict[str, Any] = json.loads(done.stdout)
    assert json.loads(report["first"])["type"] == "ready"
    assert "omp.rpc.server" in report["modules"]  # the probe saw the server's own imports
    return report


def test_a_plain_start_imports_none_of_the_lazy_modules_before_ready(tmp_path: Path) -> None:
    modules = start_report(tmp_path)["modules"]
    early = sorted(m for m in modules
                   if any(m == lazy or m.startswith(lazy + ".") for lazy in NOT_BEFORE_READY))
    assert not early, f"imported before ready: {early} (see omp/lazy.py)"


ATTRS_AT_START = ["omp.session.agent_session.AgentSession"]
"""The only attrs class a start creates (omp/lazy.py says why: attrs compiles its methods when
the class is created; this one uses its aliases and parts built after init)."""


def module_level_compiles(path: Path) -> list[str]:
    """``NAME = re.compile(...)`` statements at the top level of ``path``."""
    body = ast.parse(path.read_text(encoding="utf-8")).body
    return [f"{path.name}:{node.lineno}" for node in body
            if isinstance(node, ast.Assign) and isinstance(node.value, ast.Call)
            and ast.unparse(node.value.func) == "re.compile"]


def test_a_start_creates_one_attrs_class_and_compiles_no_pattern(tmp_path: Path) -> None:
    report = start_report(tmp_path)
    assert report["attrs_classes"] == ATTRS_AT_START, "see omp/lazy.py"
    # With the command line's own modules: ``omp --mode rpc`` imports them before ready too.
    names = {*report["modules"], "omp.cli", "omp.subcommands", "omp.__main__"}
    paths = [ROOT.parent.joinpath(*name.split(".")) for name in sorted(names)
             if name.split(".")[0] == "omp"]
    files = [p / "__init__.py" if p.is_dir() else p.with_suffix(".py") for p in paths]
    assert len(files) > 50
    assert all(f.is_file() for f in files)
    compiled = [where for f in files for where in module_level_compiles(f)]
    assert compiled == [], "compile on first use instead (omp/lazy.py)"


def test_the_compile_check_sees_a_module_level_compile(tmp_path: Path) -> None:
    module = tmp_path / "m.py"
    module.write_text('import re\n\nX = re.compile(r"a")\n\n\n'
                      'def f():\n    return re.compile("b")\n')
    assert module_level_compiles(module) == ["m.py:3"]


# The same, once the start's work is done: the first commands answered and the local model
# servers asked (``get_available_models`` waits for that). Nothing is imported before the
# snapshot that the server did not import itself.
_IDLE_PROBE = """
import sys, trio, omp

async def main():
    to_server, server_in = omp.memory_pipe()
    server_out, from_server = omp.memory_pipe()
    options = omp.ServeOptions(persist=False, announce_offline=False)
    async with trio.open_nursery() as nursery:
        nursery.start_soon(lambda: omp.serve(server_in, server_out, options=options))
        await to_server.send_all(b'{"id":"1","type":"get_state"}\\n'
                                 b'{"id":"2","type":"get_available_models"}\\n')
        seen = b""
        while seen.count(b'"type":"response"') < 2:
            chunk = await from_server.receive_some()
            assert chunk, seen
            seen += chunk
        modules = sorted(sys.modules)
        await to_server.aclose()
    print("\\n".join(modules))

trio.run(main)
"""

LOADED_ONCE_READY = ("omp.mcp", "omp.mcp.config", "omp.llm.local")
"""What a start imports right after ``ready`` (the MCP files read, the local servers asked)."""
NOT_WHEN_IDLE = (
    *(m for m in NOT_BEFORE_READY if m not in LOADED_ONCE_READY),
    "json", "omp.commands.render", "omp.session.compaction", "omp.session.run", "omp.session.retry",
    "omp.rpc.paging", "omp.tools.ask", "encodings.idna", "stringprep",
)
"""Modules an idle server (started, asked, nothing run) does not hold: each is memory it would
keep for good (``bench/bench_rpc.py``'s idle RSS). ``omp.lazy`` says where each is first used;
``encodings.idna`` and ``stringprep``: the probe of the local servers resolves ASCII names
without the codec (``omp.llm.local``)."""


def test_an_idle_server_holds_none_of_the_lazy_modules(tmp_path: Path) -> None:
    env = {"HOME": str(tmp_path), "OMP_AGENT_DIR": str(tmp_path / "agent"), "PATH": "/usr/bin:/bin"}
    done = subprocess.run([sys.executable, "-P", "-c", _IDLE_PROBE], cwd=tmp_path, env=env,
                          capture_output=True, timeout=60, check=True)
    modules = done.stdout.decode().split()
    assert "omp.rpc.server" in modules  # the probe saw the server's imports
    assert "omp.llm.local" in modules  # and the local servers were asked
    held = sorted(m for m in modules
                  if any(m == lazy or m.startswith(lazy + ".") for lazy in NOT_WHEN_IDLE))
    assert not held, f"held by an idle server: {held} (see omp/lazy.py)"


def test_the_lowest_versions_session_names_test_files_that_exist() -> None:
    """``noxfile.LOWEST_TESTS`` is a list of file names (read from the source: nox is not
    installed where the tests run); a renamed or removed file must not drop out unnoticed."""
    noxfile = ROOT.parent / "noxfile.py"
    names: list[str] = []
    for node in ast.parse(noxfile.read_text(encoding="utf-8")).body:
        if isinstance(node, ast.Assign) and isinstance(node.value, ast.List) and any(
                isinstance(t, ast.Name) and t.id == "LOWEST_TESTS" for t in node.targets):
            names = [ast.literal_eval(e) for e in node.value.elts]
    assert len(names) > 10, "LOWEST_TESTS not found in noxfile.py"
    missing = [n for n in names if not (ROOT.parent / "tests" / n).is_file()]
    assert missing == [], f"noxfile.LOWEST_TESTS names files that do not exist: {missing}"


def _awaits(function: ast.AsyncFunctionDef) -> bool:
    return any(isinstance(node, ast.Await | ast.AsyncFor | ast.AsyncWith)
               for node in ast.walk(function))


def _is_protocol(node: ast.ClassDef) -> bool:
    return any(ast.unparse(base).split("[")[0].endswith("Protocol") for base in node.bases)


def undocumented_cancellation(source: str, where: str) -> list[str]:
    """The public async functions and methods of ``source`` whose docstring does not say what
    happens on cancellation (the word "cancel" in any form).

    Public: not nested in a function, no leading underscore on it or its class. Exempt: an
    ``@overload`` stub, and a function that never awaits (no checkpoint: nothing in it can be
    cancelled) unless it is a Protocol's member, whose docstring is the contract that
    implementations and callers keep.
    """
    missing: list[str] = []

    def visit(body: list[ast.stmt], prefix: str, protocol: bool) -> None:
        for node in body:
            if isinstance(node, ast.ClassDef) and not node.name.startswith("_"):
                visit(node.body, f"{prefix}{node.name}.", _is_protocol(node))
            elif isinstance(node, ast.AsyncFunctionDef) and not node.name.startswith("_"):
                if any(ast.unparse(d).split(".")[-1] == "overload" for d in node.decorator_list):
                    continue
                if not (protocol or _awaits(node)):
                    continue
                if "cancel" not in (ast.get_docstring(node) or "").lower():
                    missing.append(f"{where}:{node.lineno} {prefix}{node.name}")

    visit(ast.parse(source).body, "", False)
    return missing


def test_public_async_functions_say_what_cancellation_does() -> None:
    """The house rule: a public async function's docstring says what happens when the task
    running it is cancelled (what is cleaned up, whether ``Cancelled`` propagates)."""
    missing: list[str] = []
    checked = 0
    for path in sorted(ROOT.rglob("*.py")):
        source = path.read_text(encoding="utf-8")
        checked += source.count("async def ")
        missing += undocumented_cancellation(source, str(path.relative_to(ROOT.parent)))
    assert checked > 300  # the walk found the code
    assert missing == [], "say what happens on cancellation in the docstrings of:\n" + "\n".join(
        missing)


def test_the_cancellation_docstring_check_sees_what_it_must() -> None:
    source = '''
from typing import Protocol, overload

class Pipe(Protocol):
    async def send(self, data: bytes) -> None:
        """Send ``data``."""
        ...

class Reader:
    async def read(self) -> bytes:
        """Read a line."""
        return await self._stream.receive_some()

    async def peek(self) -> bytes:
        """The next line. On cancellation nothing is consumed."""
        return await self._stream.receive_some()

    async def noop(self) -> None:
        return None

    @overload
    async def get(self, key: int) -> int: ...

    async def _private(self) -> None:
        await self.pause()

async def main() -> None:
    async def nested() -> None:
        await pause()
    await nested()

class _Hidden:
    async def run(self) -> None:
        await self.pause()
'''
    assert undocumented_cancellation(source, "x.py") == [
        "x.py:5 Pipe.send", "x.py:10 Reader.read", "x.py:27 main"]
