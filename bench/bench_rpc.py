"""Startup, memory and throughput of `omp --mode rpc`. Run: `python bench/bench_rpc.py`.

Prints, for fresh processes (median of --runs):
  * the floor: `python -c "import trio"`, wall time from spawn to exit;
  * spawn → `ready` (first stdout line), and spawn → the response to a `get_state` written at spawn;
  * idle RSS once that response has arrived;
and the throughput of small frames through one process over pipes: N `set_steering_mode`
commands written as fast as the pipe takes them, timed until the N-th response is read.

Targets (issue 2): ready and first response within 60 ms of the floor, idle RSS <= 45 MiB,
>= 200,000 small frames/s. ``--mcp N`` also starts, after each plain start, one with N stdio
MCP servers configured (the tests' FastMCP probe server): they connect after ``ready`` and
must change neither startup figure (printed as the median of the paired differences).
``--env-block`` weighs the two ways a server can take the secrets out of the environment block
``/proc/<pid>/environ`` shows (issue 40): the way taken, overwriting them in place
(``omp.process.hide_environment_block``, timed inside a fresh interpreter with 10 secret
variables set, median of --runs), against the least a re-execution with a clean environment
adds: one more start of the interpreter (``python -c pass``, median of --runs; the values would
also have to be sent over a pipe and read back).
The processes run the offline model with `--no-session`, in the
environment of `isolation.isolated_env` (a temp agent directory, HOME and TMPDIR, removed at the
end). This is a benchmark, not a test: it prints figures, it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from isolation import isolated_env

OMP = [sys.executable, "-m", "omp", "--mode", "rpc", "--no-session", "--model", "offline/echo"]


def floor_once() -> float:
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "import trio"], check=True)
    return time.perf_counter() - start


def rss_kib(pid: int) -> int:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    raise RuntimeError("no VmRSS")


def startup_once(env: dict[str, str]) -> tuple[float, float, float]:
    """Seconds to ready, seconds to the first response, idle RSS in MiB."""
    start = time.perf_counter()
    proc = subprocess.Popen(OMP, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    assert proc.stdin is not None
    assert proc.stdout is not None
    proc.stdin.write(b'{"id":"1","type":"get_state"}\n')
    proc.stdin.flush()
    ready = proc.stdout.readline()
    t_ready = time.perf_counter() - start
    assert b'"type":"ready"' in ready, ready
    while b'"type":"response"' not in (line := proc.stdout.readline()):
        assert line, "process ended before answering"
    t_response = time.perf_counter() - start
    time.sleep(0.05)  # let it settle idle
    rss = rss_kib(proc.pid) / 1024
    proc.stdin.close()
    proc.wait(timeout=10)
    return t_ready, t_response, rss


def throughput(n: int, env: dict[str, str]) -> float:
    proc = subprocess.Popen(OMP, stdin=subprocess.PIPE, stdout=subprocess.PIPE, bufsize=0,
                            env=env)
    assert proc.stdin is not None
    assert proc.stdout is not None
    stdout = proc.stdout
    assert b'"type":"ready"' in stdout.readline()
    stdout.readline()  # available_commands_update
    payload = b'{"type":"set_steering_mode","mode":"all"}\n' * n

    def feed() -> None:
        assert proc.stdin is not None
        proc.stdin.write(payload)
        proc.stdin.close()

    start = time.perf_counter()
    writer = threading.Thread(target=feed)
    writer.start()
    seen = 0
    while seen < n:
        chunk = os.read(stdout.fileno(), 1 << 20)
        if not chunk:
            raise RuntimeError(f"output ended after {seen} responses")
        seen += chunk.count(b"\n")
    elapsed = time.perf_counter() - start
    writer.join()
    proc.wait(timeout=10)
    return n / elapsed


SECRET_ENV = {f"BENCH_SECRET_{i}_TOKEN": f"not-a-real-token-{i}" for i in range(10)}
HIDE_TIMED = """
import time
from omp.process import hide_environment_block
from omp.subprocess_env import EnvironmentPolicy
policy = EnvironmentPolicy(provider_variables=frozenset({"ANTHROPIC_API_KEY"}))
start = time.perf_counter()
hide_environment_block(policy.is_secret)
print(time.perf_counter() - start)
"""


def hide_once(env: dict[str, str]) -> float:
    """Seconds ``hide_environment_block`` takes in a fresh process."""
    done = subprocess.run([sys.executable, "-c", HIDE_TIMED], env={**env, **SECRET_ENV},
                          capture_output=True, text=True, check=True)
    return float(done.stdout)


def interpreter_once(env: dict[str, str]) -> float:
    """Seconds a bare interpreter start takes (what a re-execution adds at the least)."""
    start = time.perf_counter()
    subprocess.run([sys.executable, "-c", "pass"], env=env, check=True)
    return time.perf_counter() - start


def precompile() -> None:
    """Byte-compile the package first, as installing a wheel does: with an editable install and
    PYTHONDONTWRITEBYTECODE set (as on these machines) every start would otherwise compile every
    module from source, while trio's own bytecode (the floor) was compiled at install."""
    import compileall

    import omp

    compileall.compile_dir(os.path.dirname(omp.__file__), quiet=1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10)
    parser.add_argument("--frames", type=int, default=200_000)
    parser.add_argument("--mcp", type=int, default=0, metavar="N",
                        help="configure N stdio MCP servers")
    parser.add_argument("--env-block", action="store_true",
                        help="also weigh hiding secrets in place against a re-execution")
    args = parser.parse_args()
    precompile()

    with tempfile.TemporaryDirectory(prefix="omp-bench-rpc-") as tmp:
        env = isolated_env(Path(tmp))
        mcp_env = None
        if args.mcp:
            mcp_env = isolated_env(Path(tmp) / "mcp")
            probe = Path(__file__).resolve().parents[1] / "tests" / "data" / "mcp_probe_server.py"
            servers = {f"s{i}": {"command": sys.executable, "args": [str(probe)]}
                       for i in range(args.mcp)}
            (Path(mcp_env["OMP_AGENT_DIR"]) / "mcp.json").write_text(
                json.dumps({"mcpServers": servers}))
        # Floor and server alternate, and each server start is compared with the floor run
        # just before it: the machine's speed drifts by more than the margin being measured.
        # With --mcp a start with the servers configured follows each plain one, compared in
        # pairs the same way.
        floors, runs, mcp_runs, hides, reexec = [], [], [], [], []
        for _ in range(args.runs):
            floors.append(floor_once())
            runs.append(startup_once(env))
            if mcp_env is not None:
                mcp_runs.append(startup_once(mcp_env))
            if args.env_block:
                hides.append(hide_once(env))
                reexec.append(interpreter_once(env))
        rate = statistics.median(throughput(args.frames, env) for _ in range(3))
    floor = statistics.median(floors)
    rss = statistics.median(r[2] for r in runs)

    print(f"floor  python -c 'import trio'   {floor * 1000:8.1f} ms")
    for name, index in (("spawn -> ready", 0), ("spawn -> first response", 1)):
        value = statistics.median(r[index] for r in runs)
        over = statistics.median(r[index] - f for r, f in zip(runs, floors, strict=True))
        print(f"{name:33}{value * 1000:8.1f} ms  (floor +{over * 1000:.1f} ms, median of "
              "the differences; target <= +60)")
    print(f"idle RSS                         {rss:8.1f} MiB (target <= 45)")
    print(f"small frames through serve()     {rate:8.0f} /s  (target >= 200000; {args.frames} "
          "commands in, as many responses out, median of 3)")
    if mcp_runs:
        for name, index in (("ready", 0), ("first response", 1)):
            value = statistics.median(r[index] for r in mcp_runs)
            more = statistics.median(m[index] - r[index]
                                     for m, r in zip(mcp_runs, runs, strict=True))
            print(f"{f'with {args.mcp} MCP servers: {name}':33}{value * 1000:8.1f} ms  "
                  f"({more * 1000:+.1f} ms against none, median of the paired differences)")
    if args.env_block:
        hide = statistics.median(hides)
        again = statistics.median(reexec)
        print(f"secrets hidden in place          {hide * 1000:8.3f} ms  (10 secret variables; "
              "omp.process.hide_environment_block)")
        print(f"a re-execution, at the least     {again * 1000:8.1f} ms  (one more interpreter "
              "start: python -c pass)")


if __name__ == "__main__":
    main()
