"""Resource updates told to the model (docs/guides/mcp.md#resource-updates, setting
``mcp.notifications``).

With ``mcp.notifications: true`` each connection subscribes to its server's resources (when the
server offers ``resources.subscribe``) and hands every ``notifications/resources/updated`` of a
subscribed URI to ``ResourceUpdates``. Updates that arrive within ``mcp.notificationDebounceMs``
of the first one are told together, as one message into the conversation (a ``custom`` message:
during a run it joins at the next step; idle, it waits in the context for the next prompt; it
never starts a run by itself)::

    [MCP notification] 2 resource(s) updated:
    - mcp://probe://doc/1 (probe)
    - mcp://probe://doc/2 (probe)
    Use read(path="mcp://<uri>") to inspect if relevant.

``ResourceUpdates.run`` is a task of the MCP manager's nursery; cancelled with it (updates not
yet told are dropped).
"""

from __future__ import annotations

from collections.abc import Callable

import attrs
import trio


@attrs.define(eq=False, repr=False)
class ResourceUpdates:
    deliver: Callable[[str], None]
    """Puts the message text into the conversation."""
    debounce: float
    """Seconds from the first update of a batch to its message."""
    _pending: dict[str, str] = attrs.field(factory=dict)
    """URI → server, in arrival order."""
    _arrived: trio.Event = attrs.field(factory=trio.Event)

    def add(self, server: str, uri: str) -> None:
        self._pending.setdefault(uri, server)
        self._arrived.set()

    async def run(self) -> None:
        """Tell each batch after its debounce, until cancelled."""
        while True:
            await self._arrived.wait()
            await trio.sleep(self.debounce)
            self._arrived = trio.Event()
            batch, self._pending = self._pending, {}
            if batch:
                self.deliver(message_text(batch))


def message_text(batch: dict[str, str]) -> str:
    lines = [f"[MCP notification] {len(batch)} resource(s) updated:"]
    lines += [f"- mcp://{uri} ({server})" for uri, server in batch.items()]
    lines.append('Use read(path="mcp://<uri>") to inspect if relevant.')
    return "\n".join(lines)
