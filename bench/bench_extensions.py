"""What extension handlers cost the agent loop. Run: `python bench/bench_extensions.py`.

Three `omp.serve` instances run in this process over memory streams on the offline model (no
network, no subprocess): one without extensions, one with a no-op `tool_call` handler, one with
a `context` handler that returns the messages it got (a replacement the loop must accept). Each
round sends every server the same prompt and times `prompt` → `prompt_result`, the servers
taking turns so that drift hits them alike; the session is reset (`new_session`) between rounds
so the history does not grow, and the event filter keeps only `agent_end` (the frames a host
reads are not what is measured). Medians over --rounds:

  * per tool call: a run whose first turn makes --calls `todo` calls (a tool that never waits),
    with and without the `tool_call` handler; the difference divided by --calls;
  * per turn: a one-turn run (an echoed prompt), with and without the `context` handler; the
    difference is the cost of one turn's hook.

An extension makes the loop call all of its hooks, so the figures are the whole price of having
such an extension, not only of the handler. Target (issue 11): < 0.2 ms each. A benchmark, not a
test: it prints figures and a verdict, and asserts nothing.

The servers' agent directory is a temporary one (`isolation.isolated_env`), removed at the end.
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
from collections.abc import Callable, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Any

import trio
from embedded import Server
from isolation import isolated_env

import omp
from omp.extensions import ExtensionAPI, ExtensionContext

TARGET_MS = 0.2


CALLED = {"tool_call": 0, "context": 0}
"""How often each handler ran (printed, so a figure cannot come from a handler never called)."""


def noop_tool_call(api: ExtensionAPI) -> None:
    async def allow(event: Any, ctx: ExtensionContext) -> None:
        CALLED["tool_call"] += 1

    api.on("tool_call", allow)


def same_context(api: ExtensionAPI) -> None:
    async def keep(event: Any, ctx: ExtensionContext) -> dict[str, Any]:
        CALLED["context"] += 1
        return {"messages": event.messages}

    api.on("context", keep)


async def open_server(stack: AsyncExitStack, nursery: trio.Nursery, name: str, cwd: Path,
                      agent_dir: Path, extensions: Sequence[Callable[[ExtensionAPI], None]]
                      ) -> Server:
    to_server, server_in = omp.memory_pipe()
    server_out, from_server = omp.memory_pipe()
    options = omp.ServeOptions(model="offline/echo", cwd=cwd, agent_dir=agent_dir,
                               persist=False, announce_offline=False, discover_extensions=False,
                               extension_objects=list(extensions))

    async def run() -> None:
        await omp.serve(server_in, server_out, options=options)
        await server_out.aclose()

    nursery.start_soon(run)
    stack.push_async_callback(to_server.aclose)  # EOF: the server ends
    server = Server(name, to_server, from_server)
    await server.until(lambda f: f.get("type") == "available_commands_update")
    await server.command(type="set_event_filter", events=["agent_end"])
    return server


async def rounds_of(servers: Sequence[Server], message: str, rounds: int
                    ) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {s.name: [] for s in servers}
    for _ in range(rounds):
        for server in servers:
            await server.command(type="new_session")
            times[server.name].append(await server.timed_prompt(message))
    return times


def report(label: str, unit: str, base: list[float], extended: list[float],
           per: int) -> bool:
    base_ms = statistics.median(base) * 1000
    extended_ms = statistics.median(extended) * 1000
    added = (extended_ms - base_ms) / per
    verdict = "PASS" if added < TARGET_MS else "FAIL"
    print(f"{label:34} {added:7.3f} ms per {unit}  (run: {base_ms:7.2f} ms without, "
          f"{extended_ms:7.2f} ms with; target < {TARGET_MS}) {verdict}")
    return added < TARGET_MS


async def main_async(rounds: int, calls: int) -> None:
    with tempfile.TemporaryDirectory(prefix="omp-bench-extensions-") as tmp:
        env = isolated_env(Path(tmp))
        agent_dir = Path(env["OMP_AGENT_DIR"])
        cwd = Path(tmp) / "work"
        cwd.mkdir()
        async with trio.open_nursery() as nursery, AsyncExitStack() as stack:
            plain = await open_server(stack, nursery, "plain", cwd, agent_dir, [])
            gated = await open_server(stack, nursery, "tool_call", cwd, agent_dir,
                                      [noop_tool_call])
            context = await open_server(stack, nursery, "context", cwd, agent_dir,
                                        [same_context])
            tools = "go " + " ".join(['[[tool todo {"op": "view"}]]'] * calls)
            # Warm up: imports, caches, the first run's one-off work.
            await rounds_of([plain, gated, context], tools, 3)
            await rounds_of([plain, gated, context], "hello", 3)
            per_call = await rounds_of([plain, gated], tools, rounds)
            per_turn = await rounds_of([plain, context], "hello", rounds)
    print(f"medians of {rounds} rounds; {calls} tool calls per tool run; handler calls: "
          f"tool_call {CALLED['tool_call']}, context {CALLED['context']}")
    report("no-op tool_call handler", "tool call", per_call["plain"], per_call["tool_call"],
           calls)
    report("context handler", "turn", per_turn["plain"], per_turn["context"], 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=200)
    parser.add_argument("--calls", type=int, default=50)
    args = parser.parse_args()
    trio.run(main_async, args.rounds, args.calls)


if __name__ == "__main__":
    main()
