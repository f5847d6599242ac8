"""The worker process of ``ast_grep`` and ``ast_edit``: ``python -m omp.tools.ast_worker``.

It reads one request (``omp.tools.ast_engine.Request``, JSON) from stdin to EOF, writes its
report (``Report``, JSON) to stdout and exits. Parsing runs here rather than in a thread of the
server because ast-grep's bindings hold the GIL while they parse (a 470 KB file held it for
0.2-1.8 s as measured, the longer on a loaded machine), which would stall the server's event
loop, its answers to ``abort`` included; a process can also be killed at once, and nothing it
does is ever half done: it never writes a file (``ast_edit`` writes in the server, after the
whole plan is known).
"""

from __future__ import annotations

import sys

import msgspec

from .ast_engine import Request, serve


def main() -> None:
    request = msgspec.json.decode(sys.stdin.buffer.read(), type=Request)
    sys.stdout.buffer.write(msgspec.json.encode(serve(request)))
    sys.stdout.buffer.flush()


if __name__ == "__main__":
    main()
