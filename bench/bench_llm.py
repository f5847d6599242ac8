"""Decode throughput of the providers. Run: `python bench/bench_llm.py`.

The fake LLM server runs in its own process (`python -m omp.testing.fake_llm`) and streams
N text deltas as fast as it can; this process runs one `ModelCall` per API over real HTTP and
turns every delta into a `StreamEvent` (the consumer only counts them: no snapshot is taken).
Prints deltas/s (wall) and CPU µs per delta of this process (the client side only).

Target (issue 3): >= 50,000 deltas/s on one core. A benchmark, not a test: it asserts nothing.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time

import httpx
import trio

from omp.llm.builder import StreamEvent
from omp.llm.stream import ModelCall
from omp.llm.types import Context
from omp.protocol.messages import UserMessage
from omp.protocol.payloads import Model, ModelCost

APIS = {
    "openai-completions": "/v1",
    "openai-responses": "/v1",
    "anthropic-messages": "",
    "google-generative-ai": "/v1beta",
}


def start_server(deltas: int) -> tuple[subprocess.Popen[bytes], str, str]:
    script = [{"repeat": True, "chunks": [{"text": f"w{i % 10} "} for i in range(deltas)],
               "usage": {"input": 10, "output": deltas}}]
    fd, path = tempfile.mkstemp(suffix=".json")
    with os.fdopen(fd, "w") as f:
        json.dump(script, f)
    proc = subprocess.Popen([sys.executable, "-m", "omp.testing.fake_llm", "--script", path],
                            stdout=subprocess.PIPE)
    assert proc.stdout is not None
    line = proc.stdout.readline().decode()
    return proc, line.rsplit(" ", 1)[-1].strip(), path


async def one(api: str, base_url: str, http: httpx.AsyncClient) -> tuple[int, float, float]:
    model = Model(id="bench", name="bench", api=api, provider="bench", baseUrl=base_url,
                  reasoning=False, input=["text"],
                  cost=ModelCost(input=1, output=1, cacheRead=0, cacheWrite=0),
                  contextWindow=100_000, maxTokens=1000)
    count = 0

    def emit(event: StreamEvent) -> None:
        nonlocal count
        if event.type == "text_delta":
            count += 1

    call = ModelCall(model, Context(messages=(UserMessage(content="go", timestamp=0),)))
    cpu, wall = time.process_time(), time.perf_counter()
    final = await call.run(emit, http=http)
    wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
    assert final.stopReason == "stop", final.errorMessage
    return count, wall, cpu


async def run(deltas: int, rounds: int) -> None:
    proc, url, path = start_server(deltas)
    try:
        async with httpx.AsyncClient(timeout=None) as http:
            for api, prefix in APIS.items():
                results = [await one(api, url + prefix, http) for _ in range(rounds)]
                count = results[0][0]
                best = min(results, key=lambda r: r[1])
                print(f"{api:22} {count} deltas  {count / best[1]:9,.0f} deltas/s  "
                      f"{best[2] / count * 1e6:6.2f} µs CPU/delta  (best of {rounds}; "
                      "target >= 50,000/s)")
    finally:
        proc.terminate()
        proc.wait()
        os.unlink(path)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--deltas", type=int, default=100_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    trio.run(run, args.deltas, args.rounds)


if __name__ == "__main__":
    main()
