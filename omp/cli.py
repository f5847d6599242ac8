"""The ``omp`` command line.

Exit codes: 0 when the host closed stdin (however much was running), 1 when stdout broke or the
runtime could not start (bad models.yml, unknown model, missing key; nothing is written to
stdout then), 2 for a usage error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

USAGE_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    from . import __version__

    parser = argparse.ArgumentParser(
        prog="omp",
        description="A coding-agent runtime on trio. With --mode rpc it reads JSON commands, one "
        "per line, on stdin and writes JSON frames, one per line, on stdout.",
        allow_abbrev=False,
    )
    parser.add_argument("--mode", choices=["rpc"], required=True,
                        help="how the runtime is driven; 'rpc' is newline-delimited JSON on stdio")
    parser.add_argument("--provider", metavar="NAME",
                        help="provider to start with (anthropic, openai, google, offline, or one "
                        "from models.yml); default: the first with an API key, else offline")
    parser.add_argument("--model", metavar="[PROVIDER/]ID", help="model to start with")
    parser.add_argument("--api-key", metavar="KEY",
                        help="API key for the chosen provider (prefer the environment variable)")
    parser.add_argument("--thinking", choices=["off", "minimal", "low", "medium", "high", "xhigh"],
                        help="thinking level to start with (clamped to the model; default off)")
    parser.add_argument("--max-line-bytes", type=_positive_int, default=None, metavar="N",
                        help="longest accepted input line in bytes (default: 64 MiB)")
    parser.add_argument("--version", action="version", version=f"omp {__version__}")
    return parser


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(arg.startswith("@") for arg in argv):
        print("omp: error: @file arguments are not supported in RPC mode", file=sys.stderr)
        return USAGE_ERROR
    args = build_parser().parse_args(argv)

    import trio

    from .llm.models import ConfigError
    from .rpc.output import OutputClosedError
    from .rpc.server import ServeOptions, serve
    from .session import SessionError

    options = ServeOptions(provider=args.provider, model=args.model, api_key=args.api_key,
                           thinking=args.thinking)
    if args.max_line_bytes is not None:
        options.max_line_bytes = args.max_line_bytes
    try:
        trio.run(lambda: serve(options=options))
    except (OutputClosedError, SessionError, ConfigError) as exc:
        print(f"omp: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0
