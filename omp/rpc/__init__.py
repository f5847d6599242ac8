"""The RPC server: reads commands, routes them to lanes, writes frames. Only this layer knows
that frames travel on a byte stream."""

from .output import OutputClosedError as OutputClosedError
from .server import ServeOptions as ServeOptions
from .server import serve as serve
