"""The names MCP tools get in a session (docs/guides/mcp.md#tool-names): ``mcp__<server>_<tool>``.

Each part is lower-cased, every run of characters outside ``[a-z0-9_]`` becomes ``_``, runs of
``_`` collapse, leading and trailing ``_`` go (an empty part becomes ``server`` / ``tool``); a
tool name that starts with ``<server>_`` loses that prefix. A name over 64 characters is cut to
55 characters + ``_`` + 8 base-36 digits of a hash of the full name. The original hashes with
Bun's Wyhash; this uses BLAKE2b (the standard library has no Wyhash), so only such very long
names differ from the original's.

Names the model makes up are accepted as the original accepts them (``alias_candidates``,
used by ``omp.session.mcp_tools.McpTools.alias``): ``mcp__<server>__<tool>`` (Claude Code's
form, even with the server's raw name) and a name that only differs in case or punctuation.
"""

from __future__ import annotations

import hashlib
import re

MAX_NAME = 64
_OUTSIDE = re.compile(r"[^a-z0-9_]+")
_UNDERSCORES = re.compile(r"_+")


def sanitize(part: str, empty: str) -> str:
    cleaned = _UNDERSCORES.sub("_", _OUTSIDE.sub("_", part.lower())).strip("_")
    return cleaned or empty


def mint_name(server: str, tool: str) -> str:
    """The session's name of ``tool`` of ``server``."""
    s = sanitize(server, "server")
    t = sanitize(tool, "tool")
    if t.startswith(s + "_") and len(t) > len(s) + 1:
        t = t[len(s) + 1:]
    name = f"mcp__{s}_{t}"
    if len(name) <= MAX_NAME:
        return name
    digest = int.from_bytes(hashlib.blake2b(name.encode(), digest_size=8).digest(), "big")
    return f"{name[:55]}_{_base36(digest)[:8]}"


def _base36(n: int) -> str:
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while True:
        n, r = divmod(n, 36)
        out = digits[r] + out
        if n == 0:
            return out



def alias_candidates(name: str) -> list[str]:
    """The minted names an unregistered ``mcp__...`` name may stand for
    (docs/guides/mcp.md#tool-names): the suffix read as ``<server>__<tool>`` at each ``__`` in it,
    minted again, then the whole suffix sanitised."""
    suffix = name[len("mcp__"):]
    found = []
    start = 0
    while (at := suffix.find("__", start)) != -1:
        left, right = suffix[:at], suffix[at + 2:]
        if left and right:
            found.append(mint_name(left, right))
        start = at + 1
    found.append("mcp__" + sanitize(suffix, "tool"))
    return list(dict.fromkeys(found))
