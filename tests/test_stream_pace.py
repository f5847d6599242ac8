"""Backpressure from the host to the provider's socket: updates are published without waiting,
and the model call awaits its sink's ``ready`` once per network read, so a host that stops
reading stops the reading of the stream (the rest stays in the socket), not the frames
already published."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import trio
from agent_helpers import write_models_yml

from omp.agent.loop import AssistantUpdate
from omp.protocol import events as ev
from omp.session import create_session
from omp.testing.fake_llm import open_fake_llm

DELTAS = 5000


class GatedSink:
    """A host whose ``ready`` blocks until ``open`` is set; it counts what it is given."""

    def __init__(self) -> None:
        self.open = trio.Event()
        self.deltas: list[str] = []
        self.waiting = 0
        self.settled = trio.Event()

    def publish(self, event: Any) -> None:
        if isinstance(event, ev.SessionSettled):
            self.settled.set()

    def publish_update(self, event: Any) -> None:
        if isinstance(event, AssistantUpdate) and event.event.type == "text_delta":
            self.deltas.append(event.event.delta)

    async def ready(self) -> None:
        self.waiting += 1
        await self.open.wait()


async def test_a_host_that_is_not_ready_stops_the_stream_between_reads(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    pieces = [f"w{i} " for i in range(DELTAS)]
    async with open_fake_llm([{"chunks": [{"text": p} for p in pieces]}]) as llm:
        write_models_yml(isolated_agent_dir, llm.base_url)
        session = create_session(model="fake/fake-model", agent_directory=isolated_agent_dir,
                                 cwd=tmp_path, persist=False, announce_offline=False)
        sink = GatedSink()
        session.subscribe(sink)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(session.serve)
                session.prompt("go")
                while not sink.waiting:  # noqa: ASYNC110 -- polling a plain counter
                    await trio.sleep(0.01)
                await trio.sleep(0.3)
                # One read's events went out; the rest waits in the socket for the host.
                held = len(sink.deltas)
                assert 0 < held < DELTAS
                assert sink.waiting == 1
                sink.open.set()
                await sink.settled.wait()
                await session.close()
    assert "".join(sink.deltas) == "".join(pieces)
    assert sink.waiting > 1  # once per read after the first, not once per delta
    assert sink.waiting < DELTAS / 10
