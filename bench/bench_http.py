"""What reading a streamed answer costs below omp: httpx against a bare HTTP/1.1 reader.
Run: `python bench/bench_http.py`.

A server in a child process (plain trio sockets, no HTTP library) answers every request with a
chunked event stream of --deltas OpenAI-style events, --burst events per HTTP chunk, bursts
paced so that --sessions streams together offer --rate events/s (as `bench_many.py`'s paced
run). This process reads --sessions such streams at once, each on its own connection, in one
of two ways, and prints the CPU time of this process per event:

  * httpx: `httpx.AsyncClient.stream` and omp's `iter_sse` (what a provider adapter does, and
    `bench_many.py`'s http floor);
  * bare: a trio TCP stream, the chunked framing parsed from bytes, omp's `SseDecoder`: about
    the least any HTTP client written in Python on trio can cost;
  * socket: the same reading and chunked framing, events only counted (no SSE decoding): what
    waking a trio task for each network read costs, under any parser.

The difference is what the HTTP stack (httpx, httpcore, h11) costs per event: the figure that
says whether a different HTTP client would pay (issue 38). Runs alternate, --runs each. A
benchmark, not a test: it prints figures and asserts nothing.
"""

from __future__ import annotations

import argparse
import functools
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable

import trio

EVENT = (b'data: {"id":"c","object":"chat.completion.chunk","created":1,"model":"m",'
         b'"choices":[{"index":0,"delta":{"content":"1234567890123456789 "},'
         b'"finish_reason":null}]}\n\n')
DONE = b"data: [DONE]\n\n"


def chunk(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


async def serve(args: argparse.Namespace) -> None:
    """The child process: one paced event stream per request, until killed."""
    period = args.burst * args.sessions / args.rate

    async def answer(stream: trio.SocketStream) -> None:
        request = b""
        while b"\r\n\r\n" not in request:
            data = await stream.receive_some(65536)
            if not data:
                return
            request += data
        head, _, body = request.partition(b"\r\n\r\n")
        length = next((int(line.split(b":")[1]) for line in head.split(b"\r\n")
                       if line.lower().startswith(b"content-length:")), 0)
        while len(body) < length:
            body += await stream.receive_some(65536)
        await stream.send_all(b"HTTP/1.1 200 OK\r\ncontent-type: text/event-stream\r\n"
                              b"transfer-encoding: chunked\r\n\r\n")
        began = trio.current_time()
        for k in range(args.deltas // args.burst):
            await trio.sleep_until(began + 0.05 + k * period)
            await stream.send_all(chunk(EVENT * args.burst))
        await stream.send_all(chunk(DONE) + b"0\r\n\r\n")
        await stream.aclose()

    listeners = await trio.open_tcp_listeners(0, host="127.0.0.1")
    print(listeners[0].socket.getsockname()[1], flush=True)
    await trio.serve_listeners(answer, listeners)


async def read_httpx(port: int, count: list[int], clients: list[object], index: int) -> None:
    import httpx

    from omp.llm.sse import iter_sse

    client = clients[index]
    assert isinstance(client, httpx.AsyncClient)
    async with client.stream("POST", f"http://127.0.0.1:{port}/", content=b"{}") as response:
        async for _ in iter_sse(response, first_timeout=100.0, idle_timeout=100.0,
                                provider="bench", model="m"):
            count[0] += 1


async def read_bare(port: int, count: list[int], clients: list[object], index: int,
                    *, decode: bool = True) -> None:
    from omp.llm.sse import SseDecoder

    stream = await trio.open_tcp_stream("127.0.0.1", port)
    await stream.send_all(b"POST / HTTP/1.1\r\nhost: bench\r\ncontent-length: 2\r\n\r\n{}")
    data = b""
    while b"\r\n\r\n" not in data:
        data += await stream.receive_some(65536)
    data = data.partition(b"\r\n\r\n")[2]
    decoder = SseDecoder()
    ended = False
    while not ended:
        position, body = 0, []
        while (line_end := data.find(b"\r\n", position)) >= 0:
            size = int(data[position:line_end], 16)
            if size == 0:
                ended = True
                break
            end = line_end + 2 + size
            if len(data) < end + 2:
                break
            body.append(data[line_end + 2:end])
            position = end + 2
        data = data[position:]
        if body:
            events = b"".join(body)
            count[0] += len(decoder.feed(events)) if decode else events.count(b"\n\n")
        if not ended:
            more = await stream.receive_some(65536)
            if not more:
                break
            data += more
    await stream.aclose()


async def run_once(port: int, how: str, args: argparse.Namespace) -> tuple[float, int]:
    """CPU seconds of this process per event, and the events read."""
    import httpx

    clients: list[object] = (
        [httpx.AsyncClient(timeout=httpx.Timeout(None, connect=30.0, read=100.0),
                           trust_env=False) for _ in range(args.sessions)]
        if how == "httpx" else [])
    readers: dict[str, Callable[[int, list[int], list[object], int], Awaitable[None]]] = {
        "httpx": read_httpx, "bare": read_bare,
        "socket": functools.partial(read_bare, decode=False)}
    read = readers[how]
    count = [0]
    spread = args.burst / args.rate

    async def one(index: int) -> None:
        await trio.sleep(index * spread)
        await read(port, count, clients, index)

    cpu = time.process_time()
    async with trio.open_nursery() as nursery:
        for index in range(args.sessions):
            nursery.start_soon(one, index)
    cpu = time.process_time() - cpu
    for client in clients:
        assert isinstance(client, httpx.AsyncClient)
        await client.aclose()
    return cpu / max(count[0], 1), count[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sessions", type=int, default=100)
    parser.add_argument("--deltas", type=int, default=2000)
    parser.add_argument("--burst", type=int, default=10)
    parser.add_argument("--rate", type=int, default=50_000)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--serve", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        trio.run(serve, args)
        return
    server = subprocess.Popen([sys.executable, __file__, "--serve", *sys.argv[1:]],
                              stdout=subprocess.PIPE)
    try:
        assert server.stdout is not None
        port = int(server.stdout.readline())
        figures: dict[str, list[float]] = {"httpx": [], "bare": [], "socket": []}
        for _ in range(args.runs):
            for how, runs in figures.items():
                per_event, events = trio.run(run_once, port, how, args)
                runs.append(per_event)
        print(f"load average (1 min) {os.getloadavg()[0]:.2f} on {os.cpu_count()} CPUs; "
              f"{args.sessions} streams, {args.burst} events an HTTP chunk, {args.rate:,}/s "
              f"offered, {events} events a run")
        for how, runs in figures.items():
            print(f"{how:<6} {statistics.median(runs) * 1e6:6.2f} µs CPU/event (median of "
                  f"{len(runs)}: " + ", ".join(f"{r * 1e6:.2f}" for r in runs) + ")")
    finally:
        server.kill()
        server.wait()


if __name__ == "__main__":
    main()
