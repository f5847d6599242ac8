"""A tool for the model: ``word_count`` counts the words, lines and characters of a text or of a
file in the working directory.

``register_tool`` gives the model a function tool like the built-in ones: its ``parameters`` are
a JSON schema (the arguments are checked against it before ``execute`` runs), and ``execute``
returns the result. An exception raised in ``execute`` becomes an error result with the
exception's message, which the model reads and can act on.

Install: copy this file into ``~/.omp/agent/extensions/``.
"""

from __future__ import annotations

from typing import Any

import trio

from omp.extensions import ExtensionAPI, ExtensionContext
from omp.tools.base import OnUpdate

PARAMETERS: dict[str, Any] = {
    "type": "object",
    "properties": {
        "text": {"type": "string", "description": "The text to count."},
        "path": {"type": "string",
                 "description": "A file to count instead, relative to the working directory."},
    },
    "additionalProperties": False,
}


async def count_words(call_id: str, params: dict[str, Any], ctx: ExtensionContext,
                      on_update: OnUpdate) -> dict[str, Any]:
    if "path" in params:
        # trio.Path: reading the file must not block the event loop the session runs on.
        text = await trio.Path(ctx.cwd, params["path"]).read_text(errors="replace")
    elif "text" in params:
        text = params["text"]
    else:
        raise ValueError("word_count needs either text or path")
    counts = {"words": len(text.split()), "lines": len(text.splitlines()),
              "characters": len(text)}
    summary = ", ".join(f"{value} {name}" for name, value in counts.items())
    return {"content": [{"type": "text", "text": summary}], "details": counts}


def setup(omp: ExtensionAPI) -> None:
    omp.register_tool("word_count", "Word count",
                      "Count the words, lines and characters of a text or a file.",
                      PARAMETERS, count_words)
