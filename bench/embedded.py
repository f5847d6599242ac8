"""A host for an embedded `omp.serve` in a benchmark: writes commands as lines and reads frames
as JSON objects from the two trio streams the benchmark wired to the server."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

import trio


class Server:
    """One embedded `omp.serve`, driven line by line."""

    def __init__(self, name: str, send: trio.abc.SendStream,
                 receive: trio.abc.ReceiveStream) -> None:
        self.name = name
        self._send = send
        self._receive = receive
        self._buffer = b""
        self._next = 0

    async def frame(self) -> dict[str, Any]:
        while b"\n" not in self._buffer:
            chunk = await self._receive.receive_some(1 << 16)
            if not chunk:
                raise EOFError(f"{self.name}: the server ended")
            self._buffer += chunk
        line, _, self._buffer = self._buffer.partition(b"\n")
        frame = json.loads(line)
        assert isinstance(frame, dict)
        return frame

    async def until(self, predicate: Callable[[dict[str, Any]], bool]) -> dict[str, Any]:
        while True:
            frame = await self.frame()
            if predicate(frame):
                return frame

    async def command(self, **fields: Any) -> dict[str, Any]:
        self._next += 1
        request_id = f"c{self._next}"
        await self._send.send_all(json.dumps({"id": request_id, **fields}).encode() + b"\n")
        response = await self.until(lambda f: f.get("type") == "response"
                                    and f.get("id") == request_id)
        assert response["success"], response
        return response

    async def timed_prompt(self, message: str) -> float:
        """Seconds from writing `prompt` to reading its `prompt_result`."""
        self._next += 1
        request_id = f"p{self._next}"
        line = json.dumps({"id": request_id, "type": "prompt", "message": message}).encode()
        start = time.perf_counter()
        await self._send.send_all(line + b"\n")
        result = await self.until(lambda f: f.get("type") == "prompt_result"
                                  and f.get("id") == request_id)
        elapsed = time.perf_counter() - start
        assert result["status"] == "completed", result
        return elapsed
