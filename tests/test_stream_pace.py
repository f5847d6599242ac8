"""Backpressure from the host to the provider's socket: updates are published without waiting;
the model call awaits its sink's ``ready`` before each network read, and between events only
while the sink says it is ``behind``. So a host that stops reading stops the reading of the
stream (the rest stays in the socket), and a host far behind stops it at the next event."""

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
    """A host whose ``ready`` blocks until ``open`` is set; it counts what it is given. With
    ``says_behind`` it also reports itself behind until then."""

    def __init__(self, *, says_behind: bool = False) -> None:
        self.says_behind = says_behind
        self.pace = self
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

    def behind(self) -> bool:
        return self.says_behind and not self.open.is_set()

    async def wait_if_behind(self) -> None:
        self.waiting += 1
        await self.open.wait()


async def stream_through(sink: GatedSink, tmp_path: Path, agent_dir: Path) -> int:
    """Prompt a 5,000-delta answer into a session whose host is ``sink``; once the stream
    waits for the host, how many deltas it had been given. Then the gate opens and the run
    settles."""
    pieces = [f"w{i} " for i in range(DELTAS)]
    async with open_fake_llm([{"chunks": [{"text": p} for p in pieces]}]) as llm:
        write_models_yml(agent_dir, llm.base_url)
        session = create_session(model="fake/fake-model", agent_directory=agent_dir,
                                 cwd=tmp_path, persist=False, announce_offline=False,
                                 sink=sink)
        with trio.fail_after(20):
            async with trio.open_nursery() as nursery:
                await nursery.start(session.run_nursery)
                session.prompt("go")
                while not sink.waiting:  # noqa: ASYNC110 -- polling a plain counter
                    await trio.sleep(0.01)
                await trio.sleep(0.3)
                held = len(sink.deltas)
                assert sink.waiting == 1  # still waiting: nothing more was read meanwhile
                sink.open.set()
                await sink.settled.wait()
                await session.aclose()
    assert "".join(sink.deltas) == "".join(pieces)
    return held


async def test_a_host_that_is_not_ready_stops_the_stream_between_reads(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    sink = GatedSink()
    held = await stream_through(sink, tmp_path, isolated_agent_dir)
    # One read's events went out (a read is at most 64 KiB: far from all 5,000 deltas); the
    # rest waited in the socket for the host.
    assert 0 < held < DELTAS
    assert sink.waiting > 1  # once per read after the first, not once per delta
    assert sink.waiting < DELTAS / 10


async def test_a_host_far_behind_stops_the_stream_at_the_next_event(
        tmp_path: Path, isolated_agent_dir: Path) -> None:
    # In snapshot mode every update is a frame with the whole message so far: the events of one
    # read must not all be turned into frames for a host that is already far behind.
    sink = GatedSink(says_behind=True)
    held = await stream_through(sink, tmp_path, isolated_agent_dir)
    assert held <= 1  # it stopped after the first event (the fake's first carries no text)
