"""Turning ``/name args…`` plus a markdown body into the text sent to the model
(docs/design/extending.md#arguments), for file commands and prompt templates alike. Pure functions,
no I/O.

1. ``split_command``: the name runs from after ``/`` to the first space (a space only: a tab or
   newline stays in the name, which then matches nothing); the args text is the rest.
2. ``parse_args``: split on spaces and tabs; ``'…'`` and ``"…"`` group words and are removed;
   no escapes; an unclosed quote runs to the end; newlines are not separators; an empty word
   (``""``) is dropped.
3. ``substitute_args``: in the body as written (never again inside a substituted value):
   ``$1`` … ``$N`` the Nth arg (``""`` when missing, ``$0`` too); ``$@`` and ``$ARGUMENTS`` all
   args joined by single spaces; ``$@[N]`` the args from the Nth on; ``$@[N:L]`` L args from the
   Nth (``""`` when N < 1 or L ≤ 0; ``$@[N:]`` is ``$@[N]``). Shell forms such as ``${1}``,
   ``${@:2}`` and ``$*`` stay as written.
4. The result is rendered (``omp.commands.render``: Handlebars with ``{args, ARGUMENTS,
   arguments}``, then the prompt formatter).
5. When the body as written has no placeholder at all (none of the ``$`` forms, and no ``{{…}}``
   naming ``args``/``arguments``/``ARGUMENTS``/``arg N``) and there are args, they are appended
   after a blank line, joined by single spaces.
"""

from __future__ import annotations

import re
from collections.abc import Sequence

_PLACEHOLDER = r"\$@\[(\d+)(?::(\d*))?\]|\$ARGUMENTS|\$@|\$(\d+)"
_USES_DOLLAR = r"\$(?:ARGUMENTS|@(?:\[\d+(?::\d*)?\])?|\d+)"
# As loose as the original's check: the lazy spans may cross from one {{ to a later }}.
_USES_HANDLEBARS = r"(?s)\{\{.*?(?:\b(?:arguments|ARGUMENTS|args)\b|\barg\s+[^}]+).*?\}\}"


def split_command(text: str) -> tuple[str, str] | None:
    """``/name args…`` as ``(name, args text)``; None when ``text`` does not start with ``/``."""
    if not text.startswith("/"):
        return None
    name, _, args_text = text[1:].partition(" ")
    return name, args_text


def parse_args(text: str) -> list[str]:
    """The words of ``text``, quotes grouping (rule 2 of the module doc)."""
    args: list[str] = []
    current: list[str] = []
    quote: str | None = None
    for char in text:
        if quote is not None:
            if char == quote:
                quote = None
            else:
                current.append(char)
        elif char in "\"'":
            quote = char
        elif char in " \t":
            if current:
                args.append("".join(current))
                current = []
        else:
            current.append(char)
    if current:
        args.append("".join(current))
    return args


def substitute_args(body: str, args: Sequence[str]) -> str:
    """``body`` with its ``$`` placeholders replaced (rule 3 of the module doc)."""

    def replace(match: re.Match[str]) -> str:
        if match[3] is not None:
            index = int(match[3]) - 1
            return args[index] if 0 <= index < len(args) else ""
        if match[1] is not None:
            start = int(match[1]) - 1
            if start < 0 or start >= len(args):
                return ""
            if not match[2]:  # $@[N] and $@[N:]
                return " ".join(args[start:])
            length = int(match[2])
            return " ".join(args[start:start + length]) if length > 0 else ""
        return " ".join(args)  # $@ and $ARGUMENTS

    return re.sub(_PLACEHOLDER, replace, body)


def uses_arg_placeholders(body: str) -> bool:
    """Whether ``body`` places its args itself (else they are appended; rule 5)."""
    return (re.search(_USES_DOLLAR, body) is not None
            or re.search(_USES_HANDLEBARS, body) is not None)


def expand(body: str, args_text: str) -> str:
    """The text a command or template ``body`` becomes when invoked with ``args_text``.

    Raises ``omp.commands.render.TemplateError`` when the body's Handlebars cannot be rendered.
    """
    from .render import format_prompt, render_handlebars  # lazy: omp.lazy says why

    args = parse_args(args_text)
    joined = " ".join(args)
    rendered = format_prompt(render_handlebars(
        substitute_args(body, args), {"args": args, "ARGUMENTS": joined, "arguments": joined}))
    if not joined or uses_arg_placeholders(body):
        return rendered
    return f"{rendered}\n\n{joined}" if rendered else joined
