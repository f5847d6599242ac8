"""The ``omp`` command line.

* ``omp --mode rpc``: serve the RPC protocol on stdio until stdin closes.
* ``omp -p MESSAGE`` (or ``--mode text``): run one prompt, print the final answer.
* ``omp --mode json MESSAGE``: run one prompt, write its events as JSON lines.

Exit codes: 0 when the host closed stdin (rpc) or the run completed (one-shot), 1 when stdout
broke, the runtime could not start (bad models.yml, unknown model, missing key; nothing is
written to stdout then) or the one-shot run ended in an error or was interrupted, 2 for a usage
error.
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any

USAGE_ERROR = 2


def build_parser() -> argparse.ArgumentParser:
    from . import __version__
    from .llm.types import THINKING_LEVELS

    parser = argparse.ArgumentParser(
        prog="omp",
        description="A coding-agent runtime on trio. With --mode rpc it reads JSON commands, one "
        "per line, on stdin and writes JSON frames, one per line, on stdout. With a message it "
        "runs that one prompt and exits.",
        allow_abbrev=False,
    )
    parser.add_argument("message", nargs="*", help="a prompt to run once (not with --mode rpc)")
    parser.add_argument("--mode", choices=["rpc", "text", "json"], default=None,
                        help="rpc: newline-delimited JSON on stdio; text: print the final answer "
                        "of MESSAGE; json: write the events of MESSAGE's run as JSON lines")
    parser.add_argument("-p", "--print", action="store_true",
                        help="run MESSAGE once and print the final answer (same as --mode text)")
    parser.add_argument("--provider", metavar="NAME",
                        help="provider to start with (anthropic, openai, google, offline, or one "
                        "from models.yml); default: the first with an API key, else offline")
    parser.add_argument("--model", metavar="[PROVIDER/]ID", help="model to start with")
    parser.add_argument("--api-key", metavar="KEY",
                        help="API key for the chosen provider (prefer the environment variable)")
    parser.add_argument("--thinking", choices=THINKING_LEVELS,
                        help="thinking level to start with (clamped to the model; default off)")
    parser.add_argument("--system-prompt", metavar="TEXT_OR_FILE",
                        help="replace the built-in instructions (text, or a file to read)")
    parser.add_argument("--append-system-prompt", metavar="TEXT_OR_FILE",
                        help="add to the system prompt (text, or a file to read)")
    sessions = parser.add_mutually_exclusive_group()
    sessions.add_argument("--session", metavar="FILE",
                          help="continue the session in FILE (created when missing)")
    sessions.add_argument("-c", "--continue", dest="resume", action="store_true",
                          help="continue the newest session of this directory")
    sessions.add_argument("--no-session", action="store_true",
                          help="keep the session in memory only (nothing written to disk)")
    parser.add_argument("--session-dir", metavar="DIR",
                        help="where session files go (default: $OMP_SESSION_DIR, else "
                        "~/.omp/agent/sessions/<encoded cwd>)")
    tools = parser.add_mutually_exclusive_group()
    tools.add_argument("--tools", metavar="NAMES",
                       help="comma-separated built-in tools to offer the model (default: read, "
                       "bash, edit, write, grep, find, ls, todo)")
    tools.add_argument("--no-tools", action="store_true",
                       help="offer no built-in tools (host tools can still be added)")
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
        print("omp: error: @file arguments are not supported", file=sys.stderr)
        return USAGE_ERROR
    parser = build_parser()
    args = parser.parse_args(argv)
    mode = args.mode or ("text" if args.print or args.message else None)
    if mode is None:
        parser.error("say how to run: --mode rpc, or a message to run once (-p MESSAGE)")
    if mode == "rpc" and (args.message or args.print):
        parser.error("--mode rpc takes its prompts on stdin, not on the command line")
    if mode != "rpc" and not args.message:
        parser.error(f"--mode {mode} needs a message")

    import trio

    from .config import ConfigError
    from .rpc.output import OutputClosedError
    from .rpc.server import ServeOptions, serve
    from .session import SessionError

    try:
        options = ServeOptions(
            provider=args.provider, model=args.model, api_key=args.api_key,
            thinking=args.thinking, system_prompt=_prompt_arg(args.system_prompt),
            persist=not args.no_session,
            session=Path(args.session).expanduser() if args.session else None,
            resume=args.resume,
            session_dir=Path(args.session_dir).expanduser() if args.session_dir else None,
            tools=[] if args.no_tools else (
                None if args.tools is None
                else [n.strip() for n in args.tools.split(",") if n.strip()]),
            append_system_prompt=_prompt_arg(args.append_system_prompt))
    except OSError as exc:
        print(f"omp: cannot read the system prompt file: {exc}", file=sys.stderr)
        return 1
    if args.max_line_bytes is not None:
        options.max_line_bytes = args.max_line_bytes
    try:
        if mode == "rpc":
            trio.run(lambda: serve(options=options))
            return 0
        return trio.run(one_shot, options, " ".join(args.message), mode)
    except (OutputClosedError, SessionError, ConfigError) as exc:
        print(f"omp: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        return 130


def _prompt_arg(value: str | None) -> str | None:
    from .session.system_prompt import load_prompt_arg

    return None if value is None else load_prompt_arg(value, Path.cwd())


async def one_shot(options: Any, message: str, mode: str) -> int:
    """Run ``message`` once on a session built from ``options``; 0 when it completed.

    On cancellation (Ctrl-C) the run is cancelled with its nursery.
    """
    import msgspec
    import trio

    from .agent.loop import AssistantUpdate
    from .protocol import events as ev
    from .protocol import messages as m
    from .session import create_session

    session = create_session(
        provider=options.provider, model=options.model, api_key=options.api_key,
        thinking=options.thinking, system_prompt=options.system_prompt,
        append_system_prompt=options.append_system_prompt, tool_names=options.tools,
        persist=options.persist, session_dir=options.session_dir, session_path=options.session,
        resume=options.resume)
    encoder = msgspec.json.Encoder()
    out = sys.stdout.buffer
    results: list[ev.PromptResult] = []
    settled = trio.Event()

    class Sink:
        def publish(self, event: Any) -> None:
            if isinstance(event, ev.PromptResult):
                results.append(event)
            if isinstance(event, ev.SessionSettled):
                settled.set()
            if mode == "json":
                if isinstance(event, AssistantUpdate):
                    update = event.event
                    event = ev.MessageUpdate(assistantMessageEvent=update.to_wire(),  # type: ignore[arg-type]
                                             message=update.partial)
                out.write(encoder.encode(event) + b"\n")
                out.flush()

        async def publish_update(self, event: Any) -> None:
            self.publish(event)
            await trio.lowlevel.checkpoint()

    session.subscribe(Sink())
    async with trio.open_nursery() as nursery:
        await nursery.start(session.serve)
        session.prompt(message)
        await settled.wait()
        nursery.cancel_scope.cancel()
    if mode == "text":
        last = next((msg for msg in reversed(session.messages)
                     if isinstance(msg, m.AssistantMessage)), None)
        text = session.last_assistant_text()
        if text:
            print(text)
        if last is not None and last.stopReason in ("error", "aborted"):
            print(f"omp: {last.errorMessage or last.stopReason}", file=sys.stderr)
    return 0 if results and all(r.status == "completed" for r in results) else 1
