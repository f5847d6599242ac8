"""The hardening probe's scenarios (issue 40) against the real `omp --mode rpc`, one figure each.
Run: `python bench/probe_hardening.py` (`--only NAME ...` runs some of them).

Scenarios, with what the last round measured (before the fixes):
  mcp-results  an MCP tool's 5, 15 and 50 MiB result (stdio FastMCP server, one JSON-RPC line
               each): seconds from `tool_execution_start` to `_end`. Was 1.3 s, 12.9 s, over
               30 s (the original: 50 MiB in 1.9 s).
  sse-event    one 100 MB server-sent event from the fake LLM: seconds to the failed turn, its
               error, the server's peak RSS growth, the longest session-file line. Was accepted
               in 56 s, peak 1.17 GB, a 105 MB session line.
  endless      a stream that never ends (empty chat-completions chunks): seconds to the failed
               turn, its error, peak RSS growth. Was read without end.
  ipv6         `web_fetch` of a loopback address in IPv6 clothing (mapped, compatible, NAT64,
               6to4, Teredo): what each call answered. Was: three of them reached a connect.
  environ      `cat /proc/$PPID/environ` in the `bash` tool with provider keys and a
               secret-looking variable in omp's environment: how many of the values it shows
               (and the uid it ran as). Was: all of them, as root.
  mcp-crash    a stdio MCP server killed (SIGKILL), then a call of its tool 0, 0.5 and 1 s
               later; and a call right after a call that crashed the server: each call's
               answer and time. Was `Tool not found` at 0.5 s, working again from 1.6 s.
  approvals    100 `bash` calls of one message under `tools.approvalMode: always-ask`, the
               host answering only once every dialog is open: seconds from the prompt to the
               100th `extension_ui_request`, and to the end of the run. Was 5.2 s of dialogs
               shown one at a time (the original opens them together: 0.5 s).

Every omp runs in the environment of `isolation.isolated_env` (agent directory, HOME, TMPDIR in
a temp directory removed at the end). A benchmark, not a test: it prints, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import signal
import sys
import tempfile
import time
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any

import trio
from bench_tools import as_dict, run_tools, status_kib
from isolation import isolated_env

from omp.client import RpcClient, UiAnswer, UiHandler
from omp.protocol import commands as cmd
from omp.protocol.events import ExtensionUiRequest
from omp.testing.fake_llm import open_fake_llm

ROOT = Path(__file__).resolve().parents[1]
PROBE = ROOT / "tests" / "data" / "mcp_probe_server.py"
RESTART = ROOT / "tests" / "data" / "mcp_restart_server.py"
OFFLINE = ("--mode", "rpc", "--no-session", "--model", "offline/echo")
FAKE = ("--mode", "rpc", "--model", "fake/fake-model")
EMPTY_CHUNK = 'data: {"id":"c","choices":[]}\n\n'
SECRETS = {"OPENAI_API_KEY": "sk-probe-openai-0123456789",
           "ANTHROPIC_API_KEY": "sk-ant-probe-0123456789",
           "PROBE_SERVICE_TOKEN": "probe-token-0123456789"}
STEP = 120.0
"""Seconds any one wait of a scenario may take before it is reported as stuck."""


def directive(tool: str, args: dict[str, Any]) -> str:
    return f"[[tool {tool} {json.dumps(args)}]]"


def text_of(end: dict[str, Any]) -> str:
    return "".join(c.get("text", "") for c in end["result"]["content"])


def first_line(text: str, width: int = 90) -> str:
    line = text.strip().splitlines()[0] if text.strip() else ""
    return line if len(line) <= width else line[:width - 1] + "…"


def reset_peak(pid: int) -> float:
    """Reset the process's peak RSS to its current RSS (``clear_refs`` 5); that RSS, MiB."""
    with open(f"/proc/{pid}/clear_refs", "w") as file:
        file.write("5")
    return status_kib(pid, "VmRSS") / 1024


def spawn(workdir: Path, env: dict[str, str], args: tuple[str, ...],
          ui: UiHandler | None = None) -> Any:
    return RpcClient.spawn(args=args, cwd=workdir, env=env, max_buffered_events=math.inf,
                           close_timeout=30, ui=ui)


async def until(client: RpcClient, predicate: Callable[[dict[str, Any]], bool]
                ) -> dict[str, Any]:
    with trio.fail_after(STEP):
        while True:
            frame = as_dict(await client.events.receive())
            if predicate(frame):
                return frame


def mounted(frame: dict[str, Any]) -> bool:
    return frame["type"] == "notice" and "mounted" in frame.get("message", "")


def write_models(agent: Path, base_url: str) -> None:
    (agent / "models.yml").write_text(
        "providers:\n  fake:\n    api: openai-completions\n"
        f"    baseUrl: {base_url}/v1\n    auth: none\n    models: [{{id: fake-model}}]\n")


def longest_line(agent: Path) -> int:
    """The longest line of the session files under ``agent``."""
    return max((len(line) for path in agent.rglob("*.jsonl")
                for line in path.read_bytes().splitlines()), default=0)


# --- the scenarios ---------------------------------------------------------------------------


async def mcp_results(workdir: Path) -> None:
    env = isolated_env(workdir)
    agent = Path(env["OMP_AGENT_DIR"])
    (agent / "config.yml").write_text("tools:\n  xdev: false\n")
    (agent / "mcp.json").write_text(json.dumps({"mcpServers": {"probe": {
        "command": sys.executable, "args": [str(PROBE)]}}}))
    print("mcp-results  an MCP tool's large result (was 1.3 s / 12.9 s / over 30 s)")
    async with spawn(workdir, env, OFFLINE) as client:
        await until(client, mounted)
        for mib in (5, 15, 50):
            run = await run_tools(client, f"m{mib}", directive("mcp__probe_big", {"mib": mib}))
            end = run.ends[-1]
            outcome = "error: " + first_line(text_of(end)) if end["isError"] else "ok"
            print(f"             {mib:>2} MiB  {run.last_end - run.first_start:7.2f} s  {outcome}")


async def stream_flood(workdir: Path, name: str, flood: dict[str, Any], config: str = "") -> None:
    env = isolated_env(workdir)
    agent = Path(env["OMP_AGENT_DIR"])
    (agent / "config.yml").write_text(config)
    async with open_fake_llm([{"flood": flood}]) as fake:
        write_models(agent, fake.base_url)
        async with spawn(workdir, env, FAKE) as client:
            pid = client.pid
            assert pid is not None
            before = reset_peak(pid)
            started = time.perf_counter()
            await client.call(cmd.Prompt(id="p", message="go"))
            error = ""
            with trio.fail_after(STEP * 3):
                while True:
                    frame = as_dict(await client.events.receive())
                    if (frame["type"] == "message_end"
                            and frame["message"].get("role") == "assistant"):
                        error = frame["message"].get("errorMessage", "")
                    if frame["type"] == "prompt_result":
                        break
            took = time.perf_counter() - started
            growth = status_kib(pid, "VmHWM") / 1024 - before
            retries = len(fake.requests) - 1
    longest = await trio.to_thread.run_sync(longest_line, agent)
    print(f"{name:<12} {took:7.2f} s to the failed turn, peak RSS +{growth:.0f} MiB, "
          f"{retries} retries, longest session line {longest:,} bytes")
    print(f"             {first_line(error, 110)}")


async def sse_event(workdir: Path) -> None:
    print("sse-event    one 100 MB event (was accepted in 56 s, peak 1.17 GB, a 105 MB line)")
    await stream_flood(workdir, "", {"prefix": 'data: "', "bytes": 100_000_000,
                                     "suffix": '"\n\n'})


RESPONSE_BYTES: int | None = None
"""``--response-mib``: the endless stream's ``stream.maxResponseBytes`` (None: the default)."""


async def endless(workdir: Path) -> None:
    bound = "the default bound" if RESPONSE_BYTES is None else f"{RESPONSE_BYTES:,} bytes"
    print(f"endless      a stream without end, {bound} (was read without end)")
    config = "" if RESPONSE_BYTES is None else f"stream:\n  maxResponseBytes: {RESPONSE_BYTES}\n"
    await stream_flood(workdir, "", {"fill": EMPTY_CHUNK}, config)


async def ipv6(workdir: Path) -> None:
    env = isolated_env(workdir)
    agent = Path(env["OMP_AGENT_DIR"])
    (agent / "config.yml").write_text("web:\n  enabled: true\n  timeoutSeconds: 5\n")
    forms = {"mapped": "::ffff:127.0.0.1", "compatible": "::127.0.0.1",
             "NAT64": "64:ff9b::7f00:1", "6to4": "2002:7f00:1::",
             "Teredo": "2001:0:4136:e378:8000:63bf:80ff:fffe"}
    print("ipv6         web_fetch of 127.0.0.1 in IPv6 clothing (was: compatible, NAT64 and "
          "6to4 reached a connect)")
    async with spawn(workdir, env, OFFLINE) as client:
        for name, address in forms.items():
            run = await run_tools(client, name, directive(
                "web_fetch", {"url": f"http://[{address}]:9/secret"}))
            end = run.ends[-1]
            text = text_of(end)
            verdict = ("refused by the address check" if "Refused to fetch" in text
                       else "NOT refused: " + first_line(text, 60))
            print(f"             {name:<10} {address:<38} {verdict} "
                  f"({(run.last_end - run.first_start) * 1000:.0f} ms)")


async def environ(workdir: Path) -> None:
    env = {**isolated_env(workdir), **SECRETS}
    print("environ      cat /proc/$PPID/environ in bash (was: every key shown, as root)")
    async with spawn(workdir, env, OFFLINE) as client:
        command = "id -u; echo $PPID; cat /proc/$PPID/environ | tr '\\0' '\\n'"
        run = await run_tools(client, "e", directive("bash", {"command": command}))
        text = text_of(run.ends[-1])
        uid, ppid, *_ = text.splitlines()
        shown = [name for name, value in SECRETS.items() if value in text]
        own = "omp's" if ppid.strip() == str(client.pid) else f"pid {ppid}'s (not omp's)"
        print(f"             uid {uid}, {own} block: {len(shown)} of {len(SECRETS)} secret "
              f"values shown{': ' + ', '.join(shown) if shown else ''}")


async def mcp_crash(workdir: Path) -> None:
    env = isolated_env(workdir)
    agent = Path(env["OMP_AGENT_DIR"])
    mark = workdir / "starts"
    (agent / "config.yml").write_text("tools:\n  xdev: false\n")
    (agent / "mcp.json").write_text(json.dumps({"mcpServers": {"restart": {
        "command": sys.executable, "args": [str(RESTART)],
        "env": {"MCP_RESTART_MARK": str(mark)}}}}))
    print("mcp-crash    a call after the server died (was Tool not found at 0.5 s, working "
          "from 1.6 s)")

    def outcome(end: dict[str, Any]) -> str:
        text = text_of(end)
        if not end["isError"]:
            return "ok, " + first_line(text, 40)
        return "error: " + (first_line(text, 70) if not text.startswith("MCP failure") else
                            next((line for line in text.splitlines()
                                  if line.startswith("message:")), text))

    async with spawn(workdir, env, OFFLINE) as client:
        await until(client, mounted)
        for delay in (0.0, 0.5, 1.0):
            # Up (a call waits for a restart still under way), and which process serves it.
            run = await run_tools(client, f"u{delay}", directive("mcp__restart_pid", {}))
            if run.ends[-1]["isError"]:  # a runtime that unmounts a server that went down
                print(f"             the call after that: {outcome(run.ends[-1])}")
                await until(client, mounted)
                run = await run_tools(client, f"v{delay}", directive("mcp__restart_pid", {}))
            pid = int(text_of(run.ends[-1]).split()[0])
            os.kill(pid, signal.SIGKILL)
            killed = time.perf_counter()
            await trio.sleep(delay)  # the scenario: a call this long after the death
            run = await run_tools(client, f"k{delay}", directive(
                "mcp__restart_echo", {"text": "hi"}))
            print(f"             killed, called {delay:.1f} s later: answered "
                  f"{run.last_end - killed:5.2f} s after the kill: {outcome(run.ends[-1])}")
        run = await run_tools(client, "c", directive("mcp__restart_crash", {}) + " "
                              + directive("mcp__restart_echo", {"text": "after"}))
        by_tool = {end["toolName"]: end for end in run.ends}  # (in the order they ended)
        crash, after = by_tool["mcp__restart_crash"], by_tool["mcp__restart_echo"]
        print(f"             a call that crashed it: {outcome(crash)}")
        print(f"             a call beside it: {outcome(after)} "
              f"({run.last_end - run.first_start:.2f} s for both)")
        run = await run_tools(client, "n", directive("mcp__restart_echo", {"text": "next"}))
        print(f"             the next call: {outcome(run.ends[-1])} "
              f"({run.last_end - run.first_start:.2f} s)")


async def approvals(workdir: Path) -> None:
    env = isolated_env(workdir)
    agent = Path(env["OMP_AGENT_DIR"])
    (agent / "config.yml").write_text("tools:\n  approvalMode: always-ask\n")
    count = 100
    arrived: list[float] = []
    all_open = trio.Event()

    async def ui(request: ExtensionUiRequest) -> UiAnswer:
        if request.method != "select":
            return None
        arrived.append(time.perf_counter())
        if len(arrived) == count:
            all_open.set()
        # Answer none until every dialog is open (or it is clear they do not all come).
        with trio.move_on_after(30):
            await all_open.wait()
        return "Approve"

    print(f"approvals    {count} bash calls of one message, always-ask (was 5.2 s, shown one at "
          "a time; the original 0.5 s)")
    async with spawn(workdir, env, OFFLINE, ui=ui) as client:
        # A first prompt's imports, not counted (``ls`` is read-only: it does not ask).
        await run_tools(client, "warm", directive("ls", {}))
        message = " ".join(directive("bash", {"command": "true"}) for _ in range(count))
        started = time.perf_counter()
        run = await run_tools(client, "a", message)
    together = "all open before any answer" if all_open.is_set() else (
        f"only {len(arrived)} open at once")
    ran = sum(1 for e in run.ends if not e["isError"])
    print(f"             prompt -> {len(arrived)}th dialog {arrived[-1] - started:6.2f} s "
          f"({together}); then -> end of run {started + run.whole - arrived[-1]:6.2f} s; "
          f"{ran} calls ran")


SCENARIOS: dict[str, Callable[[Path], Coroutine[Any, Any, None]]] = {
    "mcp-results": mcp_results, "sse-event": sse_event, "endless": endless, "ipv6": ipv6,
    "environ": environ, "mcp-crash": mcp_crash, "approvals": approvals}


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--only", nargs="+", choices=sorted(SCENARIOS), default=None)
    parser.add_argument("--response-mib", type=int, default=None,
                        help="stream.maxResponseBytes of the endless stream, MiB (default: the "
                             "default bound, 256 MiB: some minutes of 30-byte events)")
    args = parser.parse_args()
    global RESPONSE_BYTES
    RESPONSE_BYTES = None if args.response_mib is None else args.response_mib * 1024 * 1024
    print(f"python {sys.version.split()[0]}, {os.cpu_count()} CPUs, uid {os.getuid()}")
    with tempfile.TemporaryDirectory(prefix="omp-probe-") as tmp:
        for name in args.only or SCENARIOS:
            workdir = Path(tmp) / name
            workdir.mkdir()
            try:
                trio.run(SCENARIOS[name], workdir)
            except Exception as exc:  # one scenario's failure is its figure; the rest run
                print(f"{name:<12} FAILED: {type(exc).__name__}: {exc}")


if __name__ == "__main__":
    main()
