"""The text side of the ``edit`` tool (docs/design/agent-loop.md#edit): pure functions, no I/O.

The algorithm, in order:

1. Strip a UTF-8 BOM and remember the line ending (CRLF when the *first* line break is CRLF);
   normalise the text and every ``oldText``/``newText`` to LF.
2. Every ``oldText`` must be non-empty and found in the content. Exact match first; failing that,
   a fuzzy match on a normalised copy (NFKC, trailing whitespace stripped per line, smart quotes to
   ASCII, Unicode dashes to ``-``, special spaces to a space). If any edit needed the fuzzy match,
   every edit is matched against the normalised copy and the whole file is written back in
   normalised form (that is the only content the indices are valid for).
3. Each ``oldText`` must occur exactly once (counted in normalised form), and no two matches may
   overlap. Replacements are applied from the end so earlier indices stay valid.
4. A result identical to the input is an error. Line endings and the BOM are restored.

Error texts follow pi: the single-edit wording when there is one edit, ``edits[i]`` wording
otherwise.
"""

from __future__ import annotations

import difflib
import re
import unicodedata
from collections.abc import Sequence
from itertools import pairwise

import attrs

BOM = "\ufeff"
DIFF_CONTEXT_LINES = 4

_SMART_SINGLE_QUOTES = re.compile("[\u2018\u2019\u201a\u201b]")
_SMART_DOUBLE_QUOTES = re.compile("[\u201c\u201d\u201e\u201f]")
# hyphen, non-breaking hyphen, figure dash, en dash, em dash, horizontal bar, minus sign
_DASHES = re.compile("[\u2010\u2011\u2012\u2013\u2014\u2015\u2212]")
# NBSP, en quad .. hair space, narrow NBSP, medium mathematical space, ideographic space
_SPECIAL_SPACES = re.compile("[\u00a0\u2002-\u200a\u202f\u205f\u3000]")


class EditError(Exception):
    """An edit that cannot be applied; the message is what the model reads."""


@attrs.frozen
class Edit:
    old_text: str
    new_text: str


@attrs.frozen
class Match:
    """Where ``old_text`` was found; indices are into ``content`` (normalised when fuzzy)."""

    index: int
    length: int
    fuzzy: bool
    content: str


@attrs.frozen
class AppliedEdits:
    base_content: str
    """The LF content the edits were applied to (normalised form when fuzzy matching was used)."""
    new_content: str


@attrs.frozen
class Diff:
    diff: str
    first_changed_line: int | None


@attrs.frozen
class EditedFile:
    """The outcome of ``edit_text``: what to write back, and the diff for hosts."""

    text: str
    diff: str
    first_changed_line: int | None


# --- BOM and line endings -------------------------------------------------------------------


def strip_bom(text: str) -> tuple[str, str]:
    """``(bom, rest)``: the BOM (or ``""``) and the text without it."""
    if text.startswith(BOM):
        return BOM, text[1:]
    return "", text


def detect_line_ending(text: str) -> str:
    """``"\\r\\n"`` when the first line break is CRLF, else ``"\\n"``."""
    lf = text.find("\n")
    if lf > 0 and text[lf - 1] == "\r":
        return "\r\n"
    return "\n"


def normalize_to_lf(text: str) -> str:
    return text.replace("\r\n", "\n").replace("\r", "\n")


def restore_line_endings(text: str, ending: str) -> str:
    return text.replace("\n", "\r\n") if ending == "\r\n" else text


# --- matching -------------------------------------------------------------------------------


def normalize_for_fuzzy_match(text: str) -> str:
    text = unicodedata.normalize("NFKC", text)
    text = "\n".join(line.rstrip() for line in text.split("\n"))
    text = _SMART_SINGLE_QUOTES.sub("'", text)
    text = _SMART_DOUBLE_QUOTES.sub('"', text)
    text = _DASHES.sub("-", text)
    return _SPECIAL_SPACES.sub(" ", text)


def fuzzy_find_text(content: str, old_text: str) -> Match | None:
    """Exact match first, then a match of the normalised ``old_text`` in normalised content."""
    index = content.find(old_text)
    if index != -1:
        return Match(index, len(old_text), False, content)
    fuzzy_content = normalize_for_fuzzy_match(content)
    fuzzy_old = normalize_for_fuzzy_match(old_text)
    if not fuzzy_old:
        return None
    index = fuzzy_content.find(fuzzy_old)
    if index == -1:
        return None
    return Match(index, len(fuzzy_old), True, fuzzy_content)


def count_occurrences(content: str, old_text: str) -> int:
    """Non-overlapping occurrences, compared in normalised form."""
    fuzzy_old = normalize_for_fuzzy_match(old_text)
    if not fuzzy_old:
        return 0
    return normalize_for_fuzzy_match(content).count(fuzzy_old)


# --- errors (pi's wording) ------------------------------------------------------------------


def _empty_old_text(path: str, i: int, total: int) -> EditError:
    if total == 1:
        return EditError(f"oldText must not be empty in {path}.")
    return EditError(f"edits[{i}].oldText must not be empty in {path}.")


def _not_found(path: str, i: int, total: int) -> EditError:
    if total == 1:
        return EditError(f"Could not find the exact text in {path}. The old text must match "
                         "exactly including all whitespace and newlines.")
    return EditError(f"Could not find edits[{i}] in {path}. The oldText must match exactly "
                     "including all whitespace and newlines.")


def _duplicate(path: str, i: int, total: int, occurrences: int) -> EditError:
    if total == 1:
        return EditError(f"Found {occurrences} occurrences of the text in {path}. The text must "
                         "be unique. Please provide more context to make it unique.")
    return EditError(f"Found {occurrences} occurrences of edits[{i}] in {path}. Each oldText "
                     "must be unique. Please provide more context to make it unique.")


def _no_change(path: str, total: int) -> EditError:
    if total == 1:
        return EditError(f"No changes made to {path}. The replacement produced identical "
                         "content. This might indicate an issue with special characters or the "
                         "text not existing as expected.")
    return EditError(f"No changes made to {path}. The replacements produced identical content.")


# --- applying -------------------------------------------------------------------------------


def apply_edits(content: str, edits: Sequence[Edit], path: str) -> AppliedEdits:
    """Apply ``edits`` to LF-normalised ``content``; raises EditError (see module docstring)."""
    if not edits:
        raise EditError("Edit tool input is invalid. edits must contain at least one "
                        "replacement.")
    total = len(edits)
    normalized = [Edit(normalize_to_lf(e.old_text), normalize_to_lf(e.new_text)) for e in edits]
    for i, edit in enumerate(normalized):
        if not edit.old_text:
            raise _empty_old_text(path, i, total)

    initial = [fuzzy_find_text(content, e.old_text) for e in normalized]
    fuzzy = any(m is not None and m.fuzzy for m in initial)
    base = normalize_for_fuzzy_match(content) if fuzzy else content

    matched: list[tuple[int, Match, str]] = []
    for i, edit in enumerate(normalized):
        found = fuzzy_find_text(base, edit.old_text)
        if found is None:
            raise _not_found(path, i, total)
        occurrences = count_occurrences(base, edit.old_text)
        if occurrences > 1:
            raise _duplicate(path, i, total, occurrences)
        matched.append((i, found, edit.new_text))

    matched.sort(key=lambda item: item[1].index)
    for (prev_i, prev, _), (cur_i, cur, _) in pairwise(matched):
        if prev.index + prev.length > cur.index:
            raise EditError(f"edits[{prev_i}] and edits[{cur_i}] overlap in {path}. Merge them "
                            "into one edit or target disjoint regions.")

    new = base
    for _, found, new_text in reversed(matched):
        new = new[:found.index] + new_text + new[found.index + found.length:]
    if new == base:
        raise _no_change(path, total)
    return AppliedEdits(base, new)


def edit_text(raw: str, edits: Sequence[Edit], path: str) -> EditedFile:
    """The whole text pipeline: file text in (BOM, any line endings), file text out."""
    bom, text = strip_bom(raw)
    ending = detect_line_ending(text)
    applied = apply_edits(normalize_to_lf(text), edits, path)
    diff = generate_diff(applied.base_content, applied.new_content)
    return EditedFile(bom + restore_line_endings(applied.new_content, ending), diff.diff,
                      diff.first_changed_line)


# --- diff -----------------------------------------------------------------------------------


def _line_tokens(text: str) -> list[str]:
    """Lines with their ``\\n`` kept (like jsdiff's ``diffLines``), no empty last token."""
    tokens = text.split("\n")
    result = [t + "\n" for t in tokens[:-1]]
    if tokens[-1]:
        result.append(tokens[-1])
    return result


def _strip_newline(token: str) -> str:
    return token[:-1] if token.endswith("\n") else token


def generate_diff(old: str, new: str, context_lines: int = DIFF_CONTEXT_LINES) -> Diff:
    """pi's numbered diff: ``+N line`` / ``-N line`` / `` N line``, `` ...`` for skipped runs.

    Removed lines are numbered in the old file, added and context lines in the new one (context
    uses the old number, as pi does). ``first_changed_line`` is the new-file line of the first
    change.
    """
    old_tokens, new_tokens = _line_tokens(old), _line_tokens(new)
    # parts: (kind, lines) with kind in {"=", "-", "+"}; a replacement is removal then addition
    parts: list[tuple[str, list[str]]] = []
    matcher = difflib.SequenceMatcher(None, old_tokens, new_tokens, autojunk=False)
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            parts.append(("=", old_tokens[i1:i2]))
            continue
        if i2 > i1:
            parts.append(("-", old_tokens[i1:i2]))
        if j2 > j1:
            parts.append(("+", new_tokens[j1:j2]))

    width = len(str(max(len(old.split("\n")), len(new.split("\n")))))
    skipped_marker = f" {'':>{width}} ..."
    out: list[str] = []
    old_no = new_no = 1
    first_changed: int | None = None
    last_was_change = False

    def context(lines: list[str]) -> None:
        nonlocal old_no, new_no
        for line in lines:
            out.append(f" {old_no:>{width}} {_strip_newline(line)}")
            old_no += 1
            new_no += 1

    def skip(count: int) -> None:
        nonlocal old_no, new_no
        out.append(skipped_marker)
        old_no += count
        new_no += count

    for n, (kind, lines) in enumerate(parts):
        if kind != "=":
            if first_changed is None:
                first_changed = new_no
            for line in lines:
                if kind == "+":
                    out.append(f"+{new_no:>{width}} {_strip_newline(line)}")
                    new_no += 1
                else:
                    out.append(f"-{old_no:>{width}} {_strip_newline(line)}")
                    old_no += 1
            last_was_change = True
            continue
        next_is_change = n + 1 < len(parts)  # every part after an equal one is a change
        if last_was_change and next_is_change:
            if len(lines) <= context_lines * 2:
                context(lines)
            else:
                context(lines[:context_lines])
                skip(len(lines) - 2 * context_lines)
                context(lines[len(lines) - context_lines:])
        elif last_was_change:
            context(lines[:context_lines])
            if len(lines) > context_lines:
                skip(len(lines) - context_lines)
        elif next_is_change:
            hidden = max(0, len(lines) - context_lines)
            if hidden:
                skip(hidden)
            context(lines[hidden:])
        else:
            old_no += len(lines)
            new_no += len(lines)
        last_was_change = False
    return Diff("\n".join(out), first_changed)
