"""pi's own hosts drive this runtime unchanged: pi's ``RpcClient`` (TypeScript, from the npm
package ``@earendil-works/pi-coding-agent``) and pi-acp (the ACP adapter editors run for pi),
each through the real ``omp`` process against the fake model.

The npm packages are not in the repository. They are installed at test time, pinned, into a
cache directory shared by every run (``$OMP_PI_PREFIX``, default
``~/.cache/omp-ci/pi``; ``.ci/run`` installs them before the tests); a test skips, saying
why, when they cannot be had (no npm, no registry) or no JavaScript runtime can run them.
pi's ``RpcClient`` starts its CLI with ``node``: ``tests/data/pi/omp_cli.mjs`` stands in for
that CLI and runs ``python -m omp`` (with bun alone, a ``node`` that runs bun is put first on
``PATH``, as bun has none of its own).
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_helpers import fake_provider, text_reply, tool_call, tools_reply

DATA = Path(__file__).parent / "data" / "pi"
PACKAGES = {"@earendil-works/pi-coding-agent": "1.6.0", "pi-acp": "0.0.34"}
"""The versions the tests were written against (pi 1.x answers prompts with a disposition
and ends them with ``agent_settled``; pi-acp 0.0.34 waits for it)."""
INSTALL_SECONDS = 600
LIMIT = 180
"""Seconds (real time) one test may take."""
WAIT_FOR = "while [ ! -e {name} ]; do sleep 0.02; done; echo went"
"""A bash command that holds its run until the test (or the driver) creates the file."""

SUMMARY_MARK = "context summarization assistant"
"""Only the summariser's requests contain this (its system prompt)."""


def prefix() -> Path:
    if os.environ.get("OMP_PI_PREFIX"):
        return Path(os.environ["OMP_PI_PREFIX"]).expanduser()
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "omp-ci" / "pi"


SPECS = " ".join(f"{name}@{version}" for name, version in PACKAGES.items())
"""What ``npm install`` is given, and what the ``installed`` mark says once it succeeded (an
install cut short leaves no mark, so it is done again; ``.ci/run`` writes the same mark)."""


def installed(root: Path) -> bool:
    try:
        return (root / "installed").read_text().strip() == SPECS
    except OSError:
        return False


@pytest.fixture(scope="session")
def pi_packages() -> Path:
    """The directory whose ``node_modules`` holds pi's packages, installed once (under a file
    lock: parallel test workers share the directory)."""
    root = prefix()
    if installed(root):
        return root
    npm = shutil.which("npm")
    if npm is None:
        pytest.skip(
            "needs npm to install pi's packages (.ci/run installs them into ~/.cache/omp-ci/pi)"
        )
    root.mkdir(parents=True, exist_ok=True)
    with (root / ".lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not installed(root):
            try:
                done = subprocess.run(
                    [
                        npm,
                        "install",
                        "--prefix",
                        str(root),
                        "--no-save",
                        "--no-audit",
                        "--no-fund",
                        *SPECS.split(),
                    ],
                    capture_output=True,
                    text=True,
                    timeout=INSTALL_SECONDS,
                    check=False,
                )
            except (OSError, subprocess.TimeoutExpired) as exc:
                pytest.skip(f"pi's packages could not be installed from npm: {exc}")
            if done.returncode != 0:
                errors = [x for x in done.stderr.splitlines() if x.startswith("npm error")]
                pytest.skip(
                    f"pi's packages could not be installed from npm (exit "
                    f"{done.returncode}): " + " ".join(errors[:3] or ["no reason given"])
                )
            (root / "installed").write_text(SPECS + "\n")
    return root


@pytest.fixture
def javascript(tmp_path: Path) -> tuple[str, dict[str, str]]:
    """The runtime to run the drivers with, and the environment in which ``node`` exists."""
    env = dict(os.environ)
    node = shutil.which("node")
    if node is not None:
        return node, env
    bun = shutil.which("bun")
    if bun is None:
        pytest.skip(
            "needs node or bun on PATH to run pi's clients; .ci/run installs bun from "
            "npm (`npm install bun`)"
        )
    shim = tmp_path / "node-is-bun"
    shim.mkdir()
    (shim / "node").write_text(f'#!/bin/sh\nexec "{bun}" "$@"\n')
    (shim / "node").chmod(0o755)
    env["PATH"] = f"{shim}{os.pathsep}{env.get('PATH', '')}"
    return bun, env


def summary_replies() -> list[dict[str, Any]]:
    """What a manual compaction asks the model: the summary and the short summary."""
    return [
        {
            **text_reply("## Goal\nSay hello.\n\n## Next Steps\n1. Nothing."),
            "match": {"bodyContains": SUMMARY_MARK},
        },
        {
            **text_reply("Said hello."),
            "repeat": True,
            "match": {"bodyContains": "like the description of a pull request"},
        },
    ]


# The first run installs the packages (a minute or two) inside the test's time.
@pytest.mark.timeout(INSTALL_SECONDS + LIMIT)
async def test_pis_rpc_client_drives_this_runtime(
    tmp_path: Path,
    isolated_agent_dir: Path,
    pi_packages: Path,
    javascript: tuple[str, dict[str, str]],
) -> None:
    runtime, env = javascript
    cwd = tmp_path / "project"
    cwd.mkdir()
    (isolated_agent_dir / "config.yml").write_text('{"compaction": {"keepRecentTokens": 75}}\n')
    script = [
        *summary_replies(),
        text_reply("Hello from the fake"),
        tools_reply(tool_call("c1", "bash", {"command": WAIT_FOR.format(name="go")})),
        text_reply("steered"),
        text_reply("followed"),
        text_reply("queued done"),
        tools_reply(tool_call("c2", "bash", {"command": WAIT_FOR.format(name="never")})),
    ]
    client = (
        pi_packages
        / "node_modules"
        / "@earendil-works"
        / "pi-coding-agent"
        / "dist"
        / "modes"
        / "rpc"
        / "rpc-client.js"
    )
    env.update(
        OMP_PYTHON=sys.executable,
        OMP_CLI=str(DATA / "omp_cli.mjs"),
        PI_RPC_CLIENT=str(client),
        PI_CWD=str(cwd),
    )
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir):
            done = await trio.run_process(
                [runtime, str(DATA / "drive_rpc_client.mjs")],
                env=env,
                capture_stdout=True,
                capture_stderr=True,
                check=False,
            )
    stderr = done.stderr.decode(errors="replace")
    assert done.returncode == 0, stderr
    report = json.loads(done.stdout.decode().strip().splitlines()[-1])
    assert "error" not in report, report["error"] + "\n" + stderr
    assert report["state"]["model"]["id"] == "fake-model"
    assert "fake/fake-model" in report["models"]
    assert report["setModel"] == "fake-model"
    assert report["first"][-1] == "agent_settled"
    assert report["lastText"] == "Hello from the fake"
    assert (report["busyPrompt"], report["steer"], report["followUp"], report["queuedPrompt"]) == (
        "started",
        "queued",
        "queued",
        "queued",
    )
    assert report["afterQueue"] == [
        "hello",
        "wait for go",
        "steer message",
        "follow-up message",
        "queued prompt",
    ]
    assert report["abortSettled"] == {"type": "agent_settled", "aborted": True}
    assert (report["bash"]["output"], report["bash"]["exitCode"]) == ("from-bash\n", 0)
    assert report["compact"]["summary"].startswith("## Goal")
    assert report["forkMessages"][0]["text"] == "hello"
    assert report["fork"] == {"text": "hello", "cancelled": False}
    assert report["forked"]["messageCount"] == 0
    assert report["clone"] == {"cancelled": False}
    assert report["newSession"] == {"cancelled": False}
    assert report["switchSession"] == {"cancelled": False}
    assert report["switched"] is True
    assert report["clearQueue"] == {"steering": [], "followUp": []}
    assert report["tree"] >= 1
    assert report["entries"] >= 1
    assert {"agent_settled", "agent_end", "prompt_result"} <= set(report["eventTypes"])


# --- pi-acp ------------------------------------------------------------------------------


class AcpClient:
    """An editor's side of ACP (JSON-RPC 2.0, one message per line) over pi-acp's stdio:
    answers what pi-acp asks (nothing here is supported: an error), keeps its updates."""

    def __init__(self, process: trio.Process) -> None:
        assert process.stdin is not None
        assert process.stdout is not None
        self.process = process
        self.stdin, self.stdout = process.stdin, process.stdout
        self.buffer = b""
        self.next_id = 0
        self.updates: list[dict[str, Any]] = []
        self.results: dict[int, dict[str, Any]] = {}

    async def write(self, message: dict[str, Any]) -> None:
        await self.stdin.send_all(json.dumps({"jsonrpc": "2.0", **message}).encode() + b"\n")

    async def request(self, method: str, params: dict[str, Any]) -> int:
        self.next_id += 1
        await self.write({"id": self.next_id, "method": method, "params": params})
        return self.next_id

    async def read(self) -> dict[str, Any]:
        while b"\n" not in self.buffer:
            chunk = await self.stdout.receive_some()
            if not chunk:
                raise EOFError("pi-acp closed its output")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        message: dict[str, Any] = json.loads(line)
        return message

    async def step(self) -> None:
        """Handle one message: an update kept, a request of pi-acp answered, an answer kept
        for ``result``."""
        message = await self.read()
        if "method" in message and "id" in message:  # pi-acp asks the editor
            await self.write(
                {
                    "id": message["id"],
                    "error": {"code": -32601, "message": f"not supported: {message['method']}"},
                }
            )
        elif message.get("method") == "session/update":
            self.updates.append(message["params"]["update"])
        elif "id" in message:
            self.results[message["id"]] = message

    async def result(self, request_id: int) -> dict[str, Any]:
        """The answer to request ``request_id``, handling what comes before it."""
        while request_id not in self.results:
            await self.step()
        return self.results.pop(request_id)

    async def call(self, method: str, params: dict[str, Any]) -> dict[str, Any]:
        answer = await self.result(await self.request(method, params))
        assert "error" not in answer, answer
        result: dict[str, Any] = answer["result"]
        return result


@pytest.mark.timeout(INSTALL_SECONDS + LIMIT)
async def test_pi_acp_drives_this_runtime(
    tmp_path: Path,
    isolated_agent_dir: Path,
    pi_packages: Path,
    javascript: tuple[str, dict[str, str]],
) -> None:
    runtime, env = javascript
    cwd, home = tmp_path / "project", tmp_path / "home"
    cwd.mkdir()
    home.mkdir()
    # pi-acp starts `<PI_ACP_PI_COMMAND> --mode rpc --no-themes`, as it starts pi.
    command = tmp_path / "omp-as-pi"
    command.write_text(f'#!/bin/sh\nexec "{sys.executable}" -m omp --model fake/fake-model "$@"\n')
    command.chmod(0o755)
    env.update(PI_ACP_PI_COMMAND=str(command), HOME=str(home))
    script = [
        text_reply("First answer"),
        text_reply("Second answer"),
        tools_reply(tool_call("c1", "bash", {"command": "echo tooled"})),
        text_reply("The tool said tooled"),
        tools_reply(tool_call("c2", "bash", {"command": WAIT_FOR.format(name="never")})),
    ]
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir), trio.open_nursery() as nursery:
            process = await nursery.start(
                functools.partial(
                    trio.run_process,
                    [runtime, str(pi_packages / "node_modules" / "pi-acp" / "dist" / "index.js")],
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                    env=env,
                    cwd=cwd,
                    check=False,
                )
            )
            acp = AcpClient(process)
            await acp.call("initialize", {"protocolVersion": 1, "clientCapabilities": {}})
            session = await acp.call("session/new", {"cwd": str(cwd), "mcpServers": []})
            sid = session["sessionId"]

            def prompt(text: str) -> dict[str, Any]:
                return {"sessionId": sid, "prompt": [{"type": "text", "text": text}]}

            first = await acp.call("session/prompt", prompt("one"))
            second = await acp.call("session/prompt", prompt("two"))
            tooled = await acp.call("session/prompt", prompt("use a tool"))
            hanging = await acp.request("session/prompt", prompt("hang"))
            while not any(
                u.get("sessionUpdate") == "tool_call" and u.get("toolCallId") == "c2"
                for u in acp.updates
            ):
                await acp.step()
            await acp.write({"method": "session/cancel", "params": {"sessionId": sid}})
            cancelled = await acp.result(hanging)
            await acp.stdin.aclose()
            await process.wait()
    assert first["stopReason"] == "end_turn"
    assert second["stopReason"] == "end_turn"
    assert tooled["stopReason"] == "end_turn"
    assert cancelled["result"]["stopReason"] == "cancelled"
    texts = "".join(
        u["content"].get("text", "")
        for u in acp.updates
        if u.get("sessionUpdate") == "agent_message_chunk"
    )
    assert "First answer" in texts
    assert "Second answer" in texts
    assert "Queued message" not in texts
    assert any(
        u.get("sessionUpdate") == "tool_call" and u.get("toolCallId") == "c1" for u in acp.updates
    )
