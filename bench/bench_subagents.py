"""100 background subagents of the offline model spawned at once. Run:
`python bench/bench_subagents.py`.

One ``task`` call (driven in process, the way the tool calls its spawner) spawns --children
background children of the offline model; each child's assignment makes the model call
``yield`` at once, so every child is a real ``AgentSession`` with its own session file, one
model call, one tool call and its ``async-result`` delivery. Figures, medians of --runs:
  * spawn → all delivered: from the call until the parent has taken in every child's
    result (``async-result`` messages, batched as they settle);
  * peak RSS over idle: the process's peak resident size during the run minus its resident
    size just before the call (after start-up, imports and one warm-up child).

The work runs in a subprocess in the environment of `isolation.isolated_env` (sessions and
agent files in a temp directory removed at the end). Targets (issue 13): <= 1 s and
<= 100 MiB. A benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import trio
from isolation import isolated_env

CHILD_TASK = '[[tool yield {"data": {"n": %d}}]]'


def _rss_kib() -> int:
    with open("/proc/self/statm") as file:
        pages = int(file.read().split()[1])
    return pages * (resource.getpagesize() // 1024)


async def _measure(children: int, cwd: Path) -> dict[str, float]:
    from omp.llm.builder import NO_PACE
    from omp.protocol import events as ev
    from omp.protocol import messages as m
    from omp.session import create_session
    from omp.subagents import install
    from omp.tools.task import TaskItem

    delivered = 0
    done = trio.Event()
    target = 0

    class Sink:
        def publish(self, event: Any) -> None:
            nonlocal delivered
            if (isinstance(event, ev.MessageEnd) and isinstance(event.message, m.CustomMessage)
                    and event.message.customType == "async-result"):
                delivered += len(event.message.details["jobs"])
                if delivered >= target:
                    done.set()

        def publish_update(self, event: Any) -> None:
            pass

        pace = NO_PACE

    session = create_session(model="offline/echo", cwd=cwd, announce_offline=False,
                             sink=Sink())
    host = install(session, lambda frame: None, agent_directory=Path(session.prompt_options
                                                                         .agent_directory or cwd),
                   trusted=False)

    async def noop(partial: Any) -> None:
        await trio.lowlevel.checkpoint()

    async def spawn(n: int, offset: int) -> float:
        nonlocal target, done
        target, done = delivered + n, trio.Event()
        items = [TaskItem(CHILD_TASK % (offset + i), name=f"Child{offset + i}")
                 for i in range(n)]
        start = time.perf_counter()
        await host.spawn("call", "bench", items, flat=False, on_update=noop)
        await done.wait()
        elapsed = time.perf_counter() - start
        await session.wait_for_idle()
        return elapsed

    async with trio.open_nursery() as nursery:
        await nursery.start(session.run_nursery)
        await spawn(1, 0)  # warm-up: lazy imports, first file writes
        idle = _rss_kib()
        elapsed = await spawn(children, 1)
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        await session.aclose()
    return {"seconds": elapsed, "rss_over_idle_mib": max(0, peak - idle) / 1024}


def worker(children: int) -> None:
    with tempfile.TemporaryDirectory() as cwd:
        result = trio.run(_measure, children, Path(cwd))
    print(json.dumps(result))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--children", type=int, default=100)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.children)
        return
    seconds, rss = [], []
    with tempfile.TemporaryDirectory() as root:
        env = isolated_env(Path(root))
        for _ in range(args.runs):
            # A fresh process per run: peak RSS is a process-lifetime figure.
            out = subprocess.run([sys.executable, __file__, "--worker", "--children",
                                  str(args.children)], env=env, check=True,
                                 capture_output=True, text=True).stdout
            figures = json.loads(out.strip().splitlines()[-1])
            seconds.append(figures["seconds"])
            rss.append(figures["rss_over_idle_mib"])
    print(f"{args.children} offline children spawned at once (median of {args.runs} runs):")
    print(f"  spawn -> all delivered: {statistics.median(seconds) * 1000:8.1f} ms "
          "(target <= 1000 ms)")
    print(f"  peak RSS over idle:     {statistics.median(rss):8.1f} MiB (target <= 100 MiB)")


if __name__ == "__main__":
    main()
