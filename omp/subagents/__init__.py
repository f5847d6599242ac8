"""Subagents: the ``task`` tool's children, their registry and their RPC frames.

``install`` gives a session the ``task`` tool (when its depth allows spawning) and the registry
of its ``serve()``. Background children are jobs of the session (``omp.session.jobs``). See
``omp.subagents.host`` for who owns each child and how cancellation reaches it.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path

import msgspec

from ..session.agent_session import AgentSession
from .agents import BUNDLED as BUNDLED
from .agents import AgentDef as AgentDef
from .agents import discover_agents as discover_agents
from .host import SubagentHost as SubagentHost
from .registry import SubagentRegistry as SubagentRegistry
from .registry import UnknownSubagent as UnknownSubagent
from .registry import read_messages as read_messages


def install(session: AgentSession, emit: Callable[[msgspec.Struct], None], *,
            agent_directory: Path, trusted: bool) -> SubagentHost:
    """The subagent host of ``session`` (a main session, while it is being built): its
    registry writes frames with ``emit``; ``host.tool()`` is the ``task`` tool to offer when
    ``host.can_spawn()``. Reads the agent files (blocking, before serving)."""
    registry = SubagentRegistry(emit=emit, epoch=lambda: session.runs.job_epoch)
    host = SubagentHost(session, registry, agent_directory, trusted)
    host.refresh_agents()
    return host
