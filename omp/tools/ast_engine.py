"""What ``ast_grep`` and ``ast_edit`` share: languages, metavariables, the search and rewrite
of one file's text with ast-grep's Python bindings (``ast_grep_py``), and the requests and
reports of their worker process, which does that over many files.

Everything here is blocking and runs in the tools' worker process (``omp.tools.ast_worker``,
which answers a ``Request`` with a ``Report``); ``ast_grep_py`` is imported on the first
search, never before (it is an optional dependency: ``missing_dependency`` in ``omp.tools``
says what to install). Two habits of the bindings shape this module:

* an unknown language makes them panic (a Rust panic, raised as a ``BaseException`` and printed
  with a backtrace), so a language is checked against ``LANGUAGES`` before it gets there;
* a metavariable in a replacement is not filled in by ``replace`` (their documentation says so:
  the host language builds the text), so ``expand`` does it, from what the pattern captured.

Positions in the bindings are indexes into the Python string (code points), so slicing the
source with them is exact.
"""

from __future__ import annotations

import os
import re
from collections.abc import Iterable
from pathlib import PurePath
from typing import TYPE_CHECKING

import msgspec

from ..files import UnusableFile, read_regular

if TYPE_CHECKING:
    from ast_grep_py import SgNode

LANGUAGES: dict[str, tuple[str, ...]] = {
    "bash": (".sh", ".bash", ".zsh", ".ksh", ".bats"),
    "c": (".c", ".h"),
    "cpp": (".cc", ".cpp", ".cxx", ".c++", ".hh", ".hpp", ".hxx", ".cu", ".cuh", ".ino"),
    "csharp": (".cs",),
    "css": (".css",),
    "dart": (".dart",),
    "elixir": (".ex", ".exs"),
    "go": (".go",),
    "haskell": (".hs",),
    "hcl": (".hcl", ".tf", ".tfvars"),
    "html": (".html", ".htm", ".xhtml"),
    "java": (".java",),
    "javascript": (".js", ".mjs", ".cjs", ".jsx"),
    "json": (".json",),
    "kotlin": (".kt", ".kts", ".ktm"),
    "lua": (".lua",),
    "nix": (".nix",),
    "php": (".php",),
    "python": (".py", ".pyi", ".py3", ".bzl"),
    "ruby": (".rb", ".rbw", ".gemspec"),
    "rust": (".rs",),
    "scala": (".scala", ".sc", ".sbt"),
    "solidity": (".sol",),
    "swift": (".swift",),
    "tsx": (".tsx",),
    "typescript": (".ts", ".mts", ".cts"),
    "yaml": (".yml", ".yaml"),
}
"""The languages built into ast-grep's bindings, with the extensions that infer them."""

_ALIASES = {"sh": "bash", "shell": "bash", "c++": "cpp", "cs": "csharp", "c#": "csharp",
            "ex": "elixir", "golang": "go", "hs": "haskell", "terraform": "hcl",
            "js": "javascript", "jsx": "javascript", "kt": "kotlin", "py": "python",
            "rb": "ruby", "rs": "rust", "sol": "solidity", "ts": "typescript", "yml": "yaml"}
_BY_EXTENSION = {ext: lang for lang, exts in LANGUAGES.items() for ext in exts}
_ALSO = {"cpp": (".h",)}
"""Extensions searched with ``lang`` although they infer another language (a C++ header)."""

_METAVARIABLE = re.compile(r"\$\$\$([A-Z_][A-Z0-9_]*)|\$([A-Z_][A-Z0-9_]*)")
MAX_FILE_BYTES = 4 * 1024 * 1024
"""The largest file parsed (as ``edit``'s limit: bigger files are for bash)."""


class PatternError(Exception):
    """A pattern, a language or a replacement that cannot be used (the message says why)."""


def language(name: str) -> str:
    """The bindings' name for a language a model wrote (``ts``, ``Python``, ``c++``)."""
    key = name.strip().lower()
    key = _ALIASES.get(key, key)
    if key not in LANGUAGES:
        raise PatternError(f"Unknown language: {name!r} (known: {', '.join(LANGUAGES)})")
    return key


def infer_language(path: PurePath) -> str | None:
    """The language ``path``'s extension says, or None."""
    return _BY_EXTENSION.get(path.suffix.lower())


def searched_with(path: PurePath, lang: str) -> bool:
    """Whether a file found by walking a directory is searched when ``lang`` is given."""
    return infer_language(path) == lang or path.suffix.lower() in _ALSO.get(lang, ())


class Metavariable(msgspec.Struct, frozen=True):
    name: str
    multiple: bool
    """``$$$NAME``: any number of nodes."""


def metavariables(pattern: str) -> list[Metavariable]:
    """The capturing metavariables of ``pattern``, first occurrence first; ``$_`` and other
    names starting with ``_`` match without capturing."""
    found: dict[str, Metavariable] = {}
    for match in _METAVARIABLE.finditer(pattern):
        multiple = match.group(1) is not None
        name = match.group(1) or match.group(2)
        if not name.startswith("_") and name not in found:
            found[name] = Metavariable(name, multiple)
    return list(found.values())


def check_template(template: str, pattern: str) -> None:
    """Raise PatternError when ``template`` names a metavariable ``pattern`` does not
    capture (nothing could fill it in)."""
    captured = {m.name for m in metavariables(pattern)}
    for match in _METAVARIABLE.finditer(template):
        name = match.group(1) or match.group(2)
        if name not in captured:
            raise PatternError(f"out uses ${name}, which the pattern {pattern!r} does not "
                               "capture")


def expand(template: str, values: dict[str, str]) -> str:
    """``template`` with each ``$NAME`` / ``$$$NAME`` replaced by ``values[NAME]``."""
    return _METAVARIABLE.sub(lambda m: values[m.group(1) or m.group(2)], template)


def captured(node: SgNode, source: str, names: Iterable[Metavariable]) -> dict[str, str]:
    """What ``node`` (a match) captured: a ``$$$`` metavariable as the source from its first
    node to its last (separators and spacing kept), empty when it matched nothing."""
    values: dict[str, str] = {}
    for var in names:
        if var.multiple:
            nodes = node.get_multiple_matches(var.name)
            values[var.name] = (source[nodes[0].range().start.index:
                                       nodes[-1].range().end.index] if nodes else "")
        else:
            single = node.get_match(var.name)
            values[var.name] = "" if single is None else single.text()
    return values


def error_text(exc: BaseException) -> str:
    """The bindings' error without the Rust backtrace they may carry."""
    text = str(exc).split("Stack backtrace:")[0]
    lines = [line.strip() for line in text.splitlines()]
    return "; ".join(line for line in lines if line and line != "Caused by:")


def _is_panic(exc: BaseException) -> bool:
    # pyo3 raises a Rust panic as PanicException, a BaseException that its module does not
    # export: known by name. Anything else (KeyboardInterrupt...) is not ours to swallow.
    return type(exc).__name__ == "PanicException"


class Found(msgspec.Struct, frozen=True):
    """One match: 1-based line and column, its text, what it captured."""

    line: int
    column: int
    text: str
    captured: dict[str, str]


class Searched(msgspec.Struct, frozen=True):
    matches: list[Found]
    total: int
    """Every match, also those not in ``matches``."""
    parse_error: bool
    """The file's tree holds an error node: matches there may be missing."""


def parse(source: str, lang: str) -> SgNode:
    """The root node of ``source`` in ``lang`` (a name from ``LANGUAGES``)."""
    from ast_grep_py import SgRoot

    return SgRoot(source, lang).root()


def find_all(root: SgNode, pattern: str, lang: str) -> list[SgNode]:
    """The nodes under ``root`` that ``pattern`` matches, in source order. Raises
    PatternError when the pattern does not parse as ``lang``."""
    try:
        return list(root.find_all(pattern=pattern))
    except BaseException as exc:
        if not isinstance(exc, Exception) and not _is_panic(exc):
            raise
        raise PatternError(f"The pattern {pattern!r} is not valid {lang}: "
                           f"{error_text(exc)}") from None


def has_parse_error(root: SgNode) -> bool:
    return root.find(kind="ERROR") is not None


MAX_TEXT = 2000
"""The most characters of a match's text (and of each metavariable's) a result carries: a
pattern like ``$A`` matches whole files."""


def _cut(text: str) -> str:
    return text if len(text) <= MAX_TEXT else text[:MAX_TEXT] + "…"


def search(source: str, lang: str, pattern: str, *, start: int = 0,
           stop: int | None = None) -> Searched:
    """The matches of ``pattern`` in ``source`` from the ``start``-th to before the
    ``stop``-th (all by default; texts cut at ``MAX_TEXT``), and how many there are."""
    root = parse(source, lang)
    names = metavariables(pattern)
    nodes = find_all(root, pattern, lang)
    found = []
    for node in nodes[start:stop]:
        at = node.range().start
        found.append(Found(at.line + 1, at.column + 1, _cut(node.text()),
                           {k: _cut(v) for k, v in captured(node, source, names).items()}))
    return Searched(found, len(nodes), has_parse_error(root))


class Rewritten(msgspec.Struct, frozen=True):
    text: str
    count: int


def rewrite(source: str, lang: str, pattern: str, template: str) -> Rewritten:
    """``source`` with every match of ``pattern`` replaced by ``template`` filled in. A match
    inside another one is left (the outer one's replacement holds its text). Raises
    PatternError when the pattern does not parse as ``lang`` or the result does not parse
    although ``source`` did."""
    root = parse(source, lang)
    names = metavariables(pattern)
    edits = []
    end = -1
    for node in find_all(root, pattern, lang):
        span = node.range()
        if span.start.index < end:  # nested in (or overlapping) the previous match
            continue
        end = span.end.index
        edits.append(node.replace(expand(template, captured(node, source, names))))
    if not edits:
        return Rewritten(source, 0)
    text = root.commit_edits(edits)
    if has_parse_error(parse(text, lang)) and not has_parse_error(root):
        replacement = repr(template) if template else "nothing"
        raise PatternError(f"Replacing {pattern!r} with {replacement} would leave invalid "
                           f"{lang}")
    return Rewritten(text, len(edits))


def choose_languages(paths: Iterable[PurePath], named: Iterable[PurePath],
                     lang: str | None) -> tuple[list[tuple[PurePath, str]], list[PurePath]]:
    """Which files are parsed, in which language: (file, language) pairs, and the ``named``
    files whose language nothing tells (no ``lang``, an extension ast-grep does not know).
    A file found by walking a directory is parsed when its extension infers a language (with
    ``lang``: that one); a file named on its own is always parsed, in ``lang`` if given."""
    explicit = set(named)
    chosen: list[tuple[PurePath, str]] = []
    unknown: list[PurePath] = []
    for path in paths:
        if lang is not None:
            if path in explicit or searched_with(path, lang):
                chosen.append((path, lang))
        elif (inferred := infer_language(path)) is not None:
            chosen.append((path, inferred))
        elif path in explicit:
            unknown.append(path)
    return chosen, unknown


class Unreadable(Exception):
    """A file the AST tools leave alone; the message says why."""


def read_source(path: PurePath) -> str:
    """The text of the regular file ``path`` (UTF-8, at most ``MAX_FILE_BYTES``); raises
    Unreadable otherwise."""
    try:
        data = read_regular(str(path), MAX_FILE_BYTES)
    except UnusableFile as exc:
        raise Unreadable(str(exc)) from None
    except OSError as exc:
        raise Unreadable(f"{exc.strerror or exc}: {path}") from None
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        raise Unreadable(f"Not UTF-8 text: {path}") from None


# --- many files at once: what the worker process does (``omp.tools.ast_worker``) ------------


class SearchRequest(msgspec.Struct, frozen=True, tag="search"):
    jobs: list[tuple[str, str]]
    """(file, language) pairs, in the order results are wanted."""
    pattern: str
    skip: int = 0
    page: int = 50
    """The matches reported: ``page`` of them after the first ``skip`` (all are counted)."""


class Op(msgspec.Struct, frozen=True):
    pattern: str
    template: str
    lang: str | None = None
    """None: each file's language, from its extension."""


class RewriteRequest(msgspec.Struct, frozen=True, tag="rewrite"):
    files: list[str]
    named: list[str]
    """The files an entry named itself (not found by walking a directory)."""
    ops: list[Op]
    workspace: str
    """Only files under it (symlinks resolved) may change."""


class FileMatch(msgspec.Struct, frozen=True):
    path: str
    found: Found


class SearchReport(msgspec.Struct, frozen=True, tag="search"):
    matches: list[FileMatch]
    """The requested page of the matches."""
    total: int
    files: int
    """Files with a match."""
    searched: int
    parse_errors: list[str]
    skipped: list[str]
    """Files left alone (too large, not UTF-8...), each with the reason."""
    bad_pattern: dict[str, str]
    """Language → why the pattern is not valid there (its files were not searched)."""


class Change(msgspec.Struct, frozen=True):
    path: str
    old: str
    new: str
    counts: list[int]
    """Replacements per op."""


class RewriteReport(msgspec.Struct, frozen=True, tag="rewrite"):
    changes: list[Change]
    searched: int
    skipped: list[str]
    error: str | None = None
    """Why nothing may be written (the first failure, naming the file and the op)."""


Request = SearchRequest | RewriteRequest
Report = SearchReport | RewriteReport


def search_files(request: SearchRequest) -> SearchReport:
    """Every match of the request's pattern in its files."""
    matches: list[FileMatch] = []
    total = files = searched = 0
    parse_errors: list[str] = []
    skipped: list[str] = []
    bad_pattern: dict[str, str] = {}
    for path, lang in request.jobs:
        if lang in bad_pattern:
            continue
        try:
            source = read_source(PurePath(path))
        except Unreadable as exc:
            skipped.append(str(exc))
            continue
        # The page's part in this file, counted in matches of every file before it.
        start = max(0, request.skip - total)
        stop = max(0, request.skip + request.page - total)
        try:
            result = search(source, lang, request.pattern, start=start, stop=stop)
        except PatternError as exc:
            bad_pattern[lang] = str(exc)
            continue
        searched += 1
        total += result.total
        files += result.total > 0
        if result.parse_error:
            parse_errors.append(path)
        matches.extend(FileMatch(path, found) for found in result.matches)
    return SearchReport(matches, total, files, searched, parse_errors, skipped, bad_pattern)


def inside(root: str, path: str) -> bool:
    """Whether ``path`` (symlinks resolved) lies under the directory ``root`` (resolved)."""
    real = os.path.realpath(path)
    return real == root or real.startswith(root.rstrip(os.sep) + os.sep)


def plan_rewrites(request: RewriteRequest) -> RewriteReport:
    """Every file's rewritten text, nothing written; at the first failure, only the error."""
    changes: list[Change] = []
    searched = 0
    skipped: list[str] = []
    named = set(request.named)
    root = os.path.realpath(request.workspace)

    def failed(error: str) -> RewriteReport:
        return RewriteReport([], searched, skipped, error)

    for path in request.files:
        inferred = infer_language(PurePath(path))
        applying = [(i, op, op.lang or inferred) for i, op in enumerate(request.ops)
                    if (op.lang is None and inferred is not None) or (
                        op.lang is not None
                        and (path in named or searched_with(PurePath(path), op.lang)))]
        if not applying:
            if path in named:
                return failed(f"Cannot tell the language of {path}: give lang in the op")
            continue
        if not inside(root, path):
            return failed(f"{path} is outside the workspace ({request.workspace}); ast_edit "
                          "changes files inside it only")
        try:
            source = read_source(PurePath(path))
        except Unreadable as exc:
            if path in named:
                return failed(f"Cannot rewrite {path}: {exc}")
            skipped.append(str(exc))
            continue
        searched += 1
        text = source
        counts = [0] * len(request.ops)
        for index, op, lang in applying:
            assert lang is not None
            try:
                rewritten = rewrite(text, lang, op.pattern, op.template)
            except PatternError as exc:
                return failed(f"ops[{index}] in {path}: {exc}. No file was changed")
            text, counts[index] = rewritten.text, rewritten.count
        if text != source:
            changes.append(Change(path, source, text, counts))
    return RewriteReport(changes, searched, skipped)


def serve(request: Request) -> Report:
    """What the worker answers to ``request``."""
    if isinstance(request, SearchRequest):
        return search_files(request)
    return plan_rewrites(request)


def split_jobs(jobs: list[tuple[str, str]], sizes: list[int],
               parts: int) -> list[list[tuple[str, str]]]:
    """``jobs`` in at most ``parts`` runs of neighbours (the order kept) of about equal total
    size (``sizes`` in bytes, one per job; each file also counts one, so that empty files
    spread too), for that many workers."""
    weights = [size + 1 for size in sizes]
    total = sum(weights)
    chunks: list[list[tuple[str, str]]] = [[]]
    done = 0
    for job, weight in zip(jobs, weights, strict=True):
        if chunks[-1] and done >= total * len(chunks) / parts and len(chunks) < parts:
            chunks.append([])
        chunks[-1].append(job)
        done += weight
    return [chunk for chunk in chunks if chunk]


def merge_searches(reports: list[SearchReport], skip: int, page: int) -> SearchReport:
    """One report of searches over neighbouring runs of files, in order; each was asked for
    its first ``skip + page`` matches, and the merged page is ``page`` after ``skip``."""
    matches: list[FileMatch] = []
    offset = 0
    bad_pattern: dict[str, str] = {}
    for report in reports:
        for index, match in enumerate(report.matches):
            if skip <= offset + index < skip + page:
                matches.append(match)
        offset += report.total
        bad_pattern |= report.bad_pattern
    return SearchReport(
        matches, offset, sum(r.files for r in reports), sum(r.searched for r in reports),
        [p for r in reports for p in r.parse_errors], [s for r in reports for s in r.skipped],
        bad_pattern)
