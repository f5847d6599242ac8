"""omp: a coding-agent runtime on trio, served over newline-delimited JSON (``omp --mode rpc``).

Embedding::

    import trio, omp
    trio.run(omp.serve)                                   # stdio, like `omp --mode rpc`
    async with trio.open_nursery() as nursery:            # inside a host program
        await nursery.start(omp.serve, recv_stream, send_stream)

``omp.memory_pipe()`` makes the in-process streams for that (two pipes: commands, frames).
"""

from .pipe import memory_pipe as memory_pipe
from .rpc.output import OutputClosedError as OutputClosedError
from .rpc.server import ServeOptions as ServeOptions
from .rpc.server import serve as serve

__version__ = "0.1.0"
