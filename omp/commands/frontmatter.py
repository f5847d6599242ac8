"""Markdown frontmatter: ``---`` / YAML / ``---`` at the top of a file, then the body.

Read the way the original reads command, template and skill files, so files written for it mean
the same here:

* Line endings become ``\\n`` and HTML comments (``<!-- … -->``) are removed from the whole text
  before anything else, so a comment can hide a frontmatter line.
* The first line must be ``---``; the frontmatter ends at the next ``---`` line. Without both
  there is no frontmatter and the body is the whole (normalised) text; with them the body is
  what follows, trimmed.
* The YAML goes through the project's one YAML reader (``omp.config.parse_yaml_mapping``), tabs
  read as two spaces. A value with ``: `` inside that YAML refuses (``description: Fix: the
  bug``) is read again with such values quoted, silently, as the original does.
* Still broken, it is read as plain ``key: value`` lines (values are strings) and the problem
  comes back as a value beside the result; nothing here raises for a file's content.
* Keys are normalised from kebab-case to camelCase at every depth (``argument-hint`` →
  ``argumentHint``).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import msgspec

from ..config import ConfigError, parse_yaml_mapping
from .problems import Problem

_HTML_COMMENT = r"(?s)<!--.*?-->"
_KEBAB = r"-([a-z])"
_PLAIN_SCALAR = r"(?a)^(\s*[A-Za-z_][\w-]*:\s+)(\S.*?)(\s*)$"
# A value starting with one of these is YAML syntax (quoted, flow, block, tag, anchor, comment),
# not a plain scalar that happens to contain ": ".
_NOT_PLAIN_START = frozenset("\"'[{|>!&*#")
_SIMPLE_LINE = r"^([A-Za-z0-9_-]+):\s*(.*)$"


class Frontmatter(msgspec.Struct, frozen=True):
    """A markdown file split: its frontmatter ``fields`` (camelCase keys), its ``body``, and
    what was wrong with the frontmatter, if anything (``problem``; the fields are then the
    plain ``key: value`` reading)."""

    fields: Mapping[str, Any]
    body: str
    problem: Problem | None = None


def parse_frontmatter(text: str, path: Path) -> Frontmatter:
    """``text`` (the content of ``path``) split into frontmatter and body; never raises."""
    normalized = re.sub(_HTML_COMMENT, "", _newlines(text))
    split = _split(normalized)
    if split is None:
        return Frontmatter(fields={}, body=normalized)
    yaml_text, body = split
    try:
        return Frontmatter(fields=_normalize_keys(_parse(yaml_text, path)), body=body)
    except ConfigError as error:
        detail = str(error).removeprefix(f"{path}: ")
    fields: dict[str, Any] = {}
    for line in yaml_text.split("\n"):
        if match := re.match(_SIMPLE_LINE, line):
            fields[match[1]] = match[2].strip()
    problem = Problem(path, f"broken frontmatter, read as plain `key: value` lines: {detail}")
    return Frontmatter(fields=_normalize_keys(fields), body=body, problem=problem)


def strip_frontmatter(text: str) -> str:
    """The body of a markdown file: without its frontmatter block (not parsed) and trimmed;
    the whole text when there is no frontmatter. HTML comments stay."""
    normalized = _newlines(text)
    split = _split(normalized)
    return normalized.strip() if split is None else split[1]


def _newlines(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def _split(text: str) -> tuple[str, str] | None:
    lines = text.split("\n")
    if lines[0].rstrip() != "---":
        return None
    for index in range(1, len(lines)):
        if lines[index].rstrip() == "---":
            return "\n".join(lines[1:index]), "\n".join(lines[index + 1:]).strip()
    return None


def _parse(yaml_text: str, path: Path) -> dict[Any, Any]:
    def parse(source: str) -> dict[Any, Any]:
        # The YAML starts on the file's second line, after the opening ``---``.
        parsed = parse_yaml_mapping(source.replace("\t", "  "), path,
                                    "a mapping of keys to values", first_line=2)
        return parsed or {}

    try:
        return parse(yaml_text)
    except ConfigError as error:
        first_error = error
    quoted = _quote_ambiguous_scalars(yaml_text)
    if quoted is not None:
        try:
            return parse(quoted)
        except ConfigError:
            pass
    raise first_error  # the file as written is what the user must fix


def _quote_ambiguous_scalars(yaml_text: str) -> str | None:
    """``key: a: b`` lines with the value double-quoted; None when there is none."""
    import json  # lazy: omp.lazy says why

    changed = False
    lines = []
    for line in yaml_text.split("\n"):
        match = re.match(_PLAIN_SCALAR, line)
        if match and ": " in match[2] and match[2][0] not in _NOT_PLAIN_START:
            line = f"{match[1]}{json.dumps(match[2], ensure_ascii=False)}{match[3]}"
            changed = True
        lines.append(line)
    return "\n".join(lines) if changed else None


def _normalize_keys(value: Any) -> Any:
    if isinstance(value, dict):
        return {_camel(str(key)): _normalize_keys(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_normalize_keys(item) for item in value]
    return value


def _camel(key: str) -> str:
    return re.sub(_KEBAB, lambda match: match[1].upper(), key) if "-" in key else key
