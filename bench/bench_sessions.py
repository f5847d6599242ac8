"""A long session through `omp --mode rpc`. Run: `python bench/bench_sessions.py`.

Writes a session file of --entries entries (10,000 by default) with ``SessionFile`` in a temp
directory: user/assistant turns with realistic text and usage, every fifth turn a tool call and
its result. Then, through one real process (``--model offline/echo`` with a ``--session-dir``;
``--no-session`` is tried first and refuses ``switch_session``), it measures with the project's
``RpcClient`` (protocol v2, so big responses arrive as chunk frames and are reassembled):

  * ``switch_session`` to the file: the load (first one, then the median of --runs reloads);
  * ``get_messages`` (the whole context), ``get_messages_page`` (one page of 100),
    ``get_session_stats`` and ``export_html``: wall time from request to decoded response,
    median of --runs;
  * the process's RSS (VmRSS, and the peak VmHWM, from /proc) idle before the load and with the
    session loaded.

Then ``list_sessions`` over a directory of --list stored sessions (10,000 by default; each a
header and --list-turns user/assistant exchanges of realistic text, modified at distinct
times), through another process started with that ``--session-dir``: the whole listing, the
newest 20 (``limit``) and a ``query`` (each the median of --runs, request to decoded response).

The processes run in the environment of `isolation.isolated_env` (agent directory, HOME and
TMPDIR in the temp directory, removed at the end). Targets: load <= 200 ms; the listing of
10,000 sessions <= 1 s. This is a benchmark, not a test: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import trio
from isolation import isolated_env

from omp.client import RpcClient
from omp.protocol import messages as m
from omp.protocol.frames import Response
from omp.session.file import SessionFile

LOAD_TARGET_MS = 200.0
LIST_TARGET_MS = 1000.0
MODEL = ("--model", "offline/echo")

VOCABULARY = (
    "the a to of and in for is on that with this it be as are from by at or an was can will "
    "not file function test config parser error value return type module import class method "
    "session context message token request response stream model tool result call path line "
    "update check build run fix change add remove read write edit search list query index "
    "cache buffer queue event handler process thread async await trio nursery cancel scope "
    "timeout retry backoff limit window summary compaction branch entry leaf header cursor")
WORDS = tuple(VOCABULARY.split())
FILES = ("src/parser.py", "src/config.py", "tests/test_parser.py", "README.md", "pyproject.toml",
         "src/session/store.py", "src/rpc/server.py", "docs/design.md")


def sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 22))]
    return " ".join(words).capitalize() + rng.choice((".", ".", ".", "?", ":"))


def paragraph(rng: random.Random, low: int, high: int) -> str:
    """Text of about ``low``..``high`` characters."""
    target = rng.randint(low, high)
    parts: list[str] = []
    size = 0
    while size < target:
        part = sentence(rng)
        if rng.random() < 0.1:
            part = f"`{rng.choice(FILES)}`: {part}"
        parts.append(part)
        size += len(part) + 1
    return " ".join(parts)


def code_block(rng: random.Random, lines: int) -> str:
    out = []
    for n in range(lines):
        indent = "    " * rng.randint(0, 3)
        out.append(f"{n + 1:4d}\t{indent}{' '.join(rng.choice(WORDS) for _ in range(6))}")
    return "\n".join(out)


def usage(rng: random.Random, context: int) -> m.Usage:
    output = rng.randint(40, 900)
    cache_read = context * 9 // 10
    fresh = context - cache_read
    cost = m.UsageCost(input=fresh * 3e-6, output=output * 15e-6, cacheRead=cache_read * 3e-7,
                       cacheWrite=0.0, total=fresh * 3e-6 + output * 15e-6 + cache_read * 3e-7)
    return m.Usage(input=fresh, output=output, cacheRead=cache_read, cacheWrite=0,
                   totalTokens=context + output, cost=cost)


def assistant(rng: random.Random, content: list[m.AssistantContent], context: int,
              timestamp: int, stop: m.StopReason = "stop") -> m.AssistantMessage:
    return m.AssistantMessage(content=content, api="anthropic-messages", provider="anthropic",
                              model="claude-sonnet-4-5", usage=usage(rng, context),
                              stopReason=stop, timestamp=timestamp,
                              duration=float(rng.randint(800, 20000)))


def write_session(path: Path, cwd: Path, entries: int, seed: int = 7) -> SessionFile:
    """A session of exactly ``entries`` entries (header not counted)."""
    rng = random.Random(seed)
    file = SessionFile.create_at(path, cwd=str(cwd))
    file.append_model_change("offline", "echo")
    file.append_thinking_level(None, configured="off")
    timestamp = 1_764_000_000_000
    context = 4000
    turn = 0
    while len(file.entries) < entries:
        left = entries - len(file.entries)
        turn += 1
        timestamp += rng.randint(5_000, 120_000)
        file.append_message(m.UserMessage(content=paragraph(rng, 40, 600),
                                          timestamp=timestamp, attribution="user"))
        context += rng.randint(100, 1500)
        if turn % 5 == 0 and left >= 4:
            call_id = f"toolu_{turn:06d}"
            name = rng.choice(("read", "bash", "grep"))
            args: dict[str, Any] = (
                {"path": rng.choice(FILES)} if name == "read"
                else {"command": f"pytest -q {rng.choice(FILES)}"} if name == "bash"
                else {"pattern": rng.choice(WORDS), "path": "src"})
            file.append_message(assistant(rng, [
                m.ThinkingContent(thinking=paragraph(rng, 80, 400)),
                m.TextContent(text=paragraph(rng, 30, 200)),
                m.ToolCall(id=call_id, name=name, arguments=args)], context, timestamp,
                stop="toolUse"))
            file.append_message(m.ToolResultMessage(
                toolCallId=call_id, toolName=name, isError=rng.random() < 0.05,
                content=[m.TextContent(text=code_block(rng, rng.randint(10, 120)))],
                timestamp=timestamp + 50))
            context += rng.randint(500, 4000)
        if len(file.entries) < entries:
            file.append_message(assistant(rng, [m.TextContent(text=paragraph(rng, 150, 2000))],
                                          context, timestamp + 100))
        context = min(context, 150_000)
    return file


def write_listed(directory: Path, cwd: Path, count: int, turns: int, seed: int = 11) -> int:
    """``count`` small session files as the runtime writes them (one line per entry, compact
    JSON), each modified one second after the one before; returns their total size."""
    rng = random.Random(seed)
    directory.mkdir(parents=True, exist_ok=True)
    total = 0
    for n in range(count):
        sid = f"{n:08x}-0000-7000-8000-{rng.getrandbits(48):012x}"
        lines = [{"type": "session", "version": 3, "id": sid, "cwd": str(cwd),
                  "timestamp": "2026-01-02T03:04:05.000Z"}]
        parent = None
        for turn in range(turns):
            for role, text in (("user", paragraph(rng, 40, 300)),
                               ("assistant", paragraph(rng, 150, 900))):
                entry_id = f"{turn:04x}{role[0] == 'a':04x}"
                lines.append({"type": "message", "id": entry_id, "parentId": parent,
                              "timestamp": "2026-01-02T03:04:06.000Z",
                              "message": {"role": role, "timestamp": 1_764_000_000_000,
                                          "content": [{"type": "text", "text": text}]}})
                parent = entry_id
        data = "".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines).encode()
        path = directory / f"{sid}.jsonl"
        path.write_bytes(data)
        os.utime(path, (1_700_000_000 + n, 1_700_000_000 + n))
        total += len(data)
    return total


async def bench_listing(args: argparse.Namespace, root: Path, work: Path,
                        env: dict[str, str]) -> None:
    listed = root / "listed"
    start = time.perf_counter()
    size = write_listed(listed, work, args.list, args.list_turns)
    print(f"stored sessions: {args.list} files of {args.list_turns} exchanges, "
          f"{size / 2**20:.1f} MiB, written in {time.perf_counter() - start:.2f} s")
    async with RpcClient.spawn(args=["--mode", "rpc", *MODEL, "--session-dir", str(listed)],
                               cwd=work, env=env, max_buffered_events=math.inf) as client:
        await client.request({"type": "get_state"})
        pid = client.pid
        assert pid is not None
        cpu_before = cpu_seconds(pid)
        # The process's own new session is listed too (its file exists from the start).
        every, every_min, response = await median_of(
            args.runs, lambda: client.request({"type": "list_sessions"}))
        cpu_each = (cpu_seconds(pid) - cpu_before) / args.runs
        found = len(response.data["sessions"])
        newest, newest_min, _ = await median_of(
            args.runs, lambda: client.request({"type": "list_sessions", "limit": 20}))
        query, query_min, response = await median_of(
            args.runs, lambda: client.request({"type": "list_sessions",
                                               "query": "nursery cancel"}))
        matched = len(response.data["sessions"])
    verdict = "ok" if every * 1000 <= LIST_TARGET_MS else "OVER TARGET"
    print(f"process: omp --mode rpc {' '.join(MODEL)} --session-dir DIR (list_sessions)")
    print(f"  list_sessions, all {found}, median {args.runs}  {ms(every)}  "
          f"(min {every_min * 1000:.1f}; target <= {LIST_TARGET_MS:.0f} ms: {verdict})")
    print(f"    the server's CPU time per listing  {ms(cpu_each)}  (user + system, from /proc: "
          "what the listing costs whatever else the machine runs)")
    print(f"  list_sessions limit 20, median {args.runs}   {ms(newest)}  "
          f"(min {newest_min * 1000:.1f})")
    print(f"  list_sessions query, median {args.runs}      {ms(query)}  "
          f"(min {query_min * 1000:.1f}; {matched} matched)")


def cpu_seconds(pid: int) -> float:
    """User + system CPU time of process ``pid`` so far (``/proc/<pid>/stat``)."""
    with open(f"/proc/{pid}/stat") as stat:
        fields = stat.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def vm_kib(pid: int, field: str) -> int:
    with open(f"/proc/{pid}/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1])
    raise RuntimeError(f"no {field}")


async def timed(call: Callable[[], Awaitable[Response]]) -> tuple[float, Response]:
    start = time.perf_counter()
    response = await call()
    elapsed = time.perf_counter() - start
    if not response.success:
        raise RuntimeError(f"{response.command} failed: {response.error}")
    return elapsed, response


async def median_of(runs: int, call: Callable[[], Awaitable[Response]]
                    ) -> tuple[float, float, Response]:
    """(median seconds, min seconds, the last response)."""
    times = []
    response: Response | None = None
    for _ in range(runs):
        elapsed, response = await timed(call)
        times.append(elapsed)
    assert response is not None
    return statistics.median(times), min(times), response


def ms(seconds: float) -> str:
    return f"{seconds * 1000:9.1f} ms"


async def bench(args: argparse.Namespace) -> None:
    with tempfile.TemporaryDirectory(prefix="omp-bench-sessions-") as tmp:
        root = Path(tmp)
        work, sessions = root / "work", root / "sessions"
        for directory in (work, sessions):
            directory.mkdir()
        env = isolated_env(root)

        start = time.perf_counter()
        path = root / "long-session.jsonl"
        file = write_session(path, work, args.entries)
        generated = time.perf_counter() - start
        kinds: dict[str, int] = {}
        for entry in file.entries:
            message = getattr(entry, "message", None)
            key = type(message if message is not None else entry).__name__
            kinds[key] = kinds.get(key, 0) + 1
        size = path.stat().st_size
        print(f"session file: {len(file.entries)} entries, {size / 2**20:.1f} MiB, written in "
              f"{generated:.2f} s ({', '.join(f'{k} {v}' for k, v in sorted(kinds.items()))})")
        del file

        # --no-session first, as a host would try: switch_session needs persistence.
        async with RpcClient.spawn(args=["--mode", "rpc", "--no-session", *MODEL], cwd=work,
                                   env=env, max_buffered_events=math.inf) as client:
            refused = await client.request({"type": "switch_session", "sessionPath": str(path)})
            print(f"--no-session: switch_session -> success={refused.success}: "
                  f"{refused.error or ''}; measuring with --session-dir instead")

        async with RpcClient.spawn(args=["--mode", "rpc", *MODEL, "--session-dir", str(sessions)],
                                   cwd=work, env=env, max_buffered_events=math.inf) as client:
            pid = client.pid
            assert pid is not None
            await client.request({"type": "get_state"})
            idle_rss, idle_hwm = vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM")

            def switch() -> Awaitable[Response]:
                return client.request({"type": "switch_session", "sessionPath": str(path)})

            first, _ = await timed(switch)
            load, load_min, _ = await median_of(args.runs, switch)
            state = (await client.request({"type": "get_state"})).data
            messages_loaded = state["messageCount"]
            loaded_rss, loaded_hwm = vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM")

            get_messages, gm_min, response = await median_of(
                args.runs, lambda: client.request({"type": "get_messages"}))
            assert len(response.data["messages"]) == messages_loaded
            page, page_min, _ = await median_of(
                args.runs, lambda: client.request({"type": "get_messages_page", "limit": 100}))
            stats, stats_min, response = await median_of(
                args.runs, lambda: client.request({"type": "get_session_stats"}))
            totals = response.data
            out = root / "export.html"
            export, export_min, _ = await median_of(
                args.runs, lambda: client.request({"type": "export_html",
                                                   "outputPath": str(out)}))
            html_size = out.stat().st_size
            after_rss, after_hwm = vm_kib(pid, "VmRSS"), vm_kib(pid, "VmHWM")

        verdict = "ok" if load * 1000 <= LOAD_TARGET_MS else "OVER TARGET"
        print(f"process: omp --mode rpc {' '.join(MODEL)} --session-dir DIR (RpcClient, "
              f"protocol v2); {messages_loaded} messages in the live context")
        print(f"  switch_session (load), first      {ms(first)}")
        print(f"  switch_session (load), median {args.runs}   {ms(load)}  "
              f"(min {load_min * 1000:.1f}; target <= {LOAD_TARGET_MS:.0f} ms: {verdict})")
        print(f"  get_messages, median {args.runs}            {ms(get_messages)}  "
              f"(min {gm_min * 1000:.1f})")
        print(f"  get_messages_page limit 100, med. {ms(page)}  (min {page_min * 1000:.1f})")
        print(f"  get_session_stats, median {args.runs}       {ms(stats)}  "
              f"(min {stats_min * 1000:.1f}; {totals['totalMessages']} messages, "
              f"{totals['tokens']['total']} tokens, ${totals['cost']:.2f})")
        print(f"  export_html, median {args.runs}             {ms(export)}  "
              f"(min {export_min * 1000:.1f}; {html_size / 2**20:.1f} MiB page)")
        print(f"  RSS idle, before the load         {idle_rss / 1024:9.1f} MiB "
              f"(peak {idle_hwm / 1024:.1f})")
        print(f"  RSS with the session loaded       {loaded_rss / 1024:9.1f} MiB "
              f"(peak {loaded_hwm / 1024:.1f}; +{(loaded_rss - idle_rss) / 1024:.1f} MiB)")
        print(f"  RSS after the commands above      {after_rss / 1024:9.1f} MiB "
              f"(peak {after_hwm / 1024:.1f})")
        await bench_listing(args, root, work, env)


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--entries", type=int, default=10_000)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--list", type=int, default=10_000,
                        help="stored sessions for list_sessions")
    parser.add_argument("--list-turns", type=int, default=3,
                        help="user/assistant exchanges in each stored session")
    args = parser.parse_args()
    if not sys.platform.startswith("linux"):
        print("note: RSS figures need /proc (Linux)", file=sys.stderr)
    trio.run(bench, args)


if __name__ == "__main__":
    main()
