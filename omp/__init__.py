"""omp: a coding-agent runtime on trio, served over newline-delimited JSON (``omp --mode rpc``).

Embedding::

    import trio, omp
    trio.run(omp.serve)                                   # stdio, like `omp --mode rpc`
    async with trio.open_nursery() as nursery:            # inside a host program
        await nursery.start(omp.serve, recv_stream, send_stream)

``omp.memory_pipe()`` makes the in-process streams for that (two pipes: commands, frames).

The names are loaded on first use (PEP 562): ``import omp`` alone imports nothing else, so
that the ``omp`` command (``omp.cli``, reached through this package) decides what is imported
when, and how the garbage collector runs meanwhile.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from .pipe import memory_pipe as memory_pipe
    from .rpc.output import OutputClosedError as OutputClosedError
    from .rpc.server import ServeOptions as ServeOptions
    from .rpc.server import serve as serve

__version__ = "0.1.0"
__all__ = ["OutputClosedError", "ServeOptions", "__version__", "memory_pipe", "serve"]

_HOMES = {"memory_pipe": ".pipe", "OutputClosedError": ".rpc.output",
          "ServeOptions": ".rpc.server", "serve": ".rpc.server"}


def __getattr__(name: str) -> Any:
    home = _HOMES.get(name)
    if home is None:
        raise AttributeError(f"module 'omp' has no attribute {name!r}")
    value = getattr(importlib.import_module(home, __name__), name)
    globals()[name] = value  # once: later lookups do not come here
    return value
