"""What the JavaScript extension host costs. Run: `python bench/bench_ts_extensions.py`.

The host runs on whatever the server would pick (bun on PATH, else node; `$OMP_JS_RUNTIME`
names one); without either there is nothing to measure and it says so. Medians over --starts
and --rounds:

  * host start: spawn → the host's `hello`, then loading one extension (a TypeScript file when
    the runtime strips types, else the same in JavaScript): the time a session's start gains
    when a TypeScript extension is configured (after `ready`, which it never delays);
  * one `tool_call` round trip: a run whose first turn makes --calls `todo` calls (a tool that
    never waits), on an embedded `omp.serve` (offline model) with and without a TypeScript
    extension whose `tool_call` handler returns nothing; the difference divided by --calls is
    what one handler in the host adds to one tool call (the request, the extension's code, the
    answer, through the runtime's ordering and timeout);
  * the channel alone: one `event` request and its answer, straight through
    `omp.extensions.jshost.JsHost.request`.

A benchmark, not a test: it prints figures and asserts nothing. Everything it writes (the agent
directory, the extension, the host's HOME and TMPDIR) lives in a temporary directory removed at
the end (`isolation.isolated_env`).
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio
from embedded import Server
from isolation import isolated_env

import omp
from omp.extensions.jshost import JsRuntime, find_js_runtime, open_js_host

NOOP_TS = """\
import type { ExtensionAPI } from "@oh-my-pi/pi-coding-agent";

export default function (pi: ExtensionAPI): void {
    pi.on("tool_call", async (_event) => undefined);
}
"""
NOOP_JS = """\
export default function (pi) {
    pi.on("tool_call", async (_event) => undefined);
}
"""


async def open_server(stack: AsyncExitStack, nursery: trio.Nursery, cwd: Path, agent_dir: Path,
                      extensions: list[Path]) -> tuple[Server, list[dict[str, Any]]]:
    to_server, server_in = omp.memory_pipe()
    server_out, from_server = omp.memory_pipe()
    options = omp.ServeOptions(model="offline/echo", cwd=cwd, agent_dir=agent_dir,
                               persist=False, announce_offline=False, discover_extensions=False,
                               extensions=extensions)

    async def run() -> None:
        await omp.serve(server_in, server_out, options=options)
        await server_out.aclose()

    nursery.start_soon(run)
    stack.push_async_callback(to_server.aclose)  # EOF: the server ends
    server = Server("ts", to_server, from_server)
    startup = []
    while True:
        frame = await server.frame()
        startup.append(frame)
        if frame["type"] == "available_commands_update":
            break
    await server.command(type="set_event_filter", events=["agent_end"])
    return server, startup


async def host_starts(runtime: JsRuntime, extension: Path, cwd: Path, starts: int
                      ) -> tuple[list[float], list[float], list[float]]:
    """(spawn → hello, load of the extension, one event round trip) for each start, seconds."""
    hello, load, trip = [], [], []
    for _ in range(starts):
        began = time.perf_counter()
        async with open_js_host(runtime, cwd=cwd, env=dict(os.environ)) as host:
            await host.started()
            said = time.perf_counter()
            answer = await host.request({
                "type": "load", "extensions": [{"index": 0, "path": str(extension),
                                                "name": "noop"}],
                "config": {"mode": "rpc", "trusted": False, "agentDir": str(cwd)}})
            loaded = time.perf_counter()
            assert "error" not in answer["extensions"][0], answer
            event = {"type": "event", "ext": 0, "handler": 0,
                     "event": {"type": "tool_call", "toolCallId": "c", "toolName": "bash",
                               "input": {"command": "echo"}}}
            for _ in range(20):  # warm up the handler's path
                await host.request(event)
            times = []
            for _ in range(200):
                start = time.perf_counter()
                await host.request(event)
                times.append(time.perf_counter() - start)
        hello.append(said - began)
        load.append(loaded - said)
        trip.append(statistics.median(times))
    return hello, load, trip


async def per_call(extension: Path, cwd: Path, agent_dir: Path, rounds: int, calls: int
                   ) -> tuple[float, float]:
    """Median seconds of a --calls tool run without and with the extension."""
    tools = "go " + " ".join(['[[tool todo {"op": "view"}]]'] * calls)
    async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
        plain, _ = await open_server(stack, nursery, cwd, agent_dir, [])
        gated, startup = await open_server(stack, nursery, cwd, agent_dir, [extension])
        errors = [f for f in startup if f["type"] == "extension_error"]
        assert not errors, errors
        servers = (plain, gated)
        times: dict[int, list[float]] = {0: [], 1: []}
        for n in range(3 + rounds):  # three rounds of warm-up
            for i, server in enumerate(servers):
                await server.command(type="new_session")
                took = await server.timed_prompt(tools)
                if n >= 3:
                    times[i].append(took)
    return statistics.median(times[0]), statistics.median(times[1])


def ms(seconds: float) -> str:
    return f"{seconds * 1000:8.2f} ms"


async def main_async(starts: int, rounds: int, calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="omp-bench-ts-") as tmp:
        root = Path(tmp)
        os.environ.update(isolated_env(root))  # the host's HOME and TMPDIR too
        runtime = await find_js_runtime(os.environ)
        if runtime is None:
            print("no JavaScript runtime (bun, or node) on PATH: nothing to measure")
            return
        cwd = root / "work"
        cwd.mkdir()
        extension = cwd / ("noop.ts" if runtime.typescript else "noop.js")
        extension.write_text(NOOP_TS if runtime.typescript else NOOP_JS)
        hello, load, trip = await host_starts(runtime, extension, cwd, starts)
        without, with_host = await per_call(extension, cwd, root / "agent", rounds, calls)
    name = runtime.name if runtime.version else runtime.describe()
    print(f"runtime: {name} ({runtime.path}); extension: {extension.name}")
    print(f"host start (spawn -> hello), median of {starts}:{ms(statistics.median(hello))}")
    print(f"load of one extension, median of {starts}:  {ms(statistics.median(load))}")
    print(f"event round trip on the channel, median:  {ms(statistics.median(trip))}")
    added = (with_host - without) / calls
    print(f"tool_call handler in the host, per call:  {ms(added)}  (run of {calls} calls: "
          f"{ms(without).strip()} without, {ms(with_host).strip()} with; median of {rounds})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--starts", type=int, default=10)
    parser.add_argument("--rounds", type=int, default=50)
    parser.add_argument("--calls", type=int, default=20)
    args = parser.parse_args()
    trio.run(main_async, args.starts, args.rounds, args.calls)


if __name__ == "__main__":
    main()
