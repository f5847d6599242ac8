"""The documentation stays true: the generated frame reference is current, every relative
link in README.md and docs/ leads to a file inside the repository (a plain clone has nothing
outside it), and every ``docs/<page>.md#<anchor>`` a comment or docstring of the code cites
leads to a heading of that page. The README stays a front page (what this is, set-up, a quick
start, links): the rest lives in docs/, where every page is in the site's nav and reachable by
links from the README."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import unicodedata
from pathlib import Path

import pytest
from repo_files import load_repo_file

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md"))]

FENCED = re.compile(r"^(```|~~~).*?^\1[ \t]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+).+?\1", re.S)
COMMENT = re.compile(r"<!--.*?-->", re.S)
LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s*\[[^\]]+\]:\s*(\S+)", re.M)
EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def links(text: str) -> list[str]:
    """The link targets of a Markdown page, outside code and comments."""
    prose = COMMENT.sub("", INLINE_CODE.sub("", FENCED.sub("", text)))
    return LINK.findall(prose) + REFERENCE.findall(prose)


def broken_links(page: Path, root: Path = ROOT) -> list[str]:
    problems = []
    for target in links(page.read_text()):
        if EXTERNAL.match(target) or target.startswith("#"):
            continue
        path = target.split("#", 1)[0].split("?", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.is_relative_to(root):
            problems.append(f"{target}: outside the repository")
        elif not resolved.exists():
            problems.append(f"{target}: no such file")
    return problems


def test_the_link_finder_finds_links() -> None:
    text = ("[a](x.md) ![b](img/y.png \"t\") [c](https://e.org) `[d](not.md)`\n"
            "```\n[e](fenced.md)\n```\n[f]: ref.md\n<!-- [g](hidden.md) -->\n")
    assert links(text) == ["x.md", "img/y.png", "https://e.org", "ref.md"]


def test_a_broken_link_is_reported(tmp_path: Path) -> None:
    root = tmp_path / "repo"
    (root / "docs").mkdir(parents=True)
    (tmp_path / "outside.md").write_text("")
    (root / "docs" / "index.md").write_text("")
    page = root / "docs" / "page.md"
    page.write_text("[gone](nowhere.md) [up](../../outside.md) [ok](index.md#set-up)\n")
    assert broken_links(page, root) == ["nowhere.md: no such file",
                                        "../../outside.md: outside the repository"]


@pytest.mark.parametrize("page", PAGES, ids=lambda p: str(p.relative_to(ROOT)))
def test_relative_links_resolve_inside_the_repository(page: Path) -> None:
    assert not broken_links(page)


RELATIVE_PATH = re.compile(r"(?:\.\./)+[\w./-]+")


def paths_outside(page: Path, text: str) -> list[str]:
    """Relative paths written anywhere in ``text`` (``page``'s: prose and code too, a reader
    follows them as well as links) that lead out of the repository, which a reader of the docs
    never has beside it, or to nothing in it. Nothing outside the repository is read."""
    root = os.path.normpath(ROOT)
    found = []
    for written in RELATIVE_PATH.findall(text):
        target = os.path.normpath(page.parent / written.split("#")[0])
        if not target.startswith(root + os.sep) or not os.path.exists(target):
            found.append(written)
    return found


def test_no_page_points_outside_the_repository_in_prose() -> None:
    offenders = {str(p.relative_to(ROOT)): found for p in PAGES
                 if (found := paths_outside(p, p.read_text()))}
    assert not offenders


def test_a_path_out_of_the_repository_is_found() -> None:
    page = ROOT / "docs" / "guides" / "x.md"
    assert paths_outside(page, "see `../../../design/notes.md`, ../../spec/x.md and "
                               "../index.md") == ["../../../design/notes.md", "../../spec/x.md"]


def test_the_docs_cover_the_pages_the_site_lists() -> None:
    nav = (ROOT / "mkdocs.yml").read_text()
    listed = set(re.findall(r":\s*([\w/.-]+\.md)\s*$", nav, re.M))
    present = {str(p.relative_to(ROOT / "docs")) for p in PAGES if p.name != "README.md"}
    assert listed == present


README_MAX_LINES = 250
"""The README once grew to 1,564 lines of reference text that the guides copied, and the copies
drifted. It holds what a visitor needs first; everything else belongs on a page of docs/."""


def test_the_readme_stays_a_front_page() -> None:
    lines = (ROOT / "README.md").read_text().count("\n")
    assert lines < README_MAX_LINES, (
        f"README.md has {lines} lines: move reference text to a page of docs/ and link it")


def reachable_pages(start: Path, root: Path = ROOT) -> set[Path]:
    """The Markdown pages reached from ``start`` by following relative links, page to page."""
    seen = {start.resolve()}
    todo = [start.resolve()]
    while todo:
        page = todo.pop()
        for target in links(page.read_text()):
            if EXTERNAL.match(target) or target.startswith("#"):
                continue
            found = (page.parent / target.split("#", 1)[0]).resolve()
            if found.suffix == ".md" and found.is_file() and found.is_relative_to(root) \
                    and found not in seen:
                seen.add(found)
                todo.append(found)
    return seen


def test_the_link_walk_follows_links_page_to_page(tmp_path: Path) -> None:
    (tmp_path / "docs").mkdir()
    (tmp_path / "README.md").write_text("[a](docs/a.md)\n")
    (tmp_path / "docs" / "a.md").write_text("[b](b.md#x) `[c](c.md)`\n")
    for name in "bc":
        (tmp_path / "docs" / f"{name}.md").write_text("")
    reached = reachable_pages(tmp_path / "README.md", tmp_path)
    assert {p.name for p in reached} == {"README.md", "a.md", "b.md"}


def test_every_page_is_reachable_from_the_readme() -> None:
    """A reader of the repository (on a forge, without the built site) finds every page by
    following links from the README."""
    reached = reachable_pages(ROOT / "README.md")
    orphans = [str(p.relative_to(ROOT)) for p in PAGES if p.resolve() not in reached]
    assert not orphans


CODE_DIRS = ("omp", "tests", "bench")
"""Where the code cites the docs: its comments and docstrings say ``docs/<page>.md#<anchor>``."""
POINTER = re.compile(r"(?<![\w/.-])docs/((?:[\w-]+/)*[\w.-]+\.md)#([\w-]+)")
HEADING = re.compile(r"^#{1,6}[ \t]+(.+?)(?:[ \t]+#+)?[ \t]*$", re.M)
ATTR_LIST = re.compile(r"[ \t]*\{:?([^}]*)\}[ \t]*$")
FENCE = re.compile(r"^[ \t]*(```+|~~~+).*?^[ \t]*\1[ \t]*$", re.M | re.S)


def slug(heading: str) -> str:
    """The anchor mkdocs gives a heading (Python-Markdown's ``toc`` slug): its text as rendered
    (code spans, links and emphasis unwrapped), made ASCII, punctuation dropped, lower-cased,
    each run of spaces and hyphens one ``-``."""
    text = re.sub(r"(`+)(.+?)\1", r"\2", heading)
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", text)
    text = re.sub(r"<[^>]+>|\*+", "", text)
    text = unicodedata.normalize("NFKD", text).encode("ascii", "ignore").decode("ascii")
    text = re.sub(r"[^\w\s-]", "", text).strip().lower()
    return re.sub(r"[-\s]+", "-", text)


def heading_anchors(page: Path) -> set[str]:
    """The anchors of a page's headings: an explicit ``{#id}``, else the slug; a slug already
    taken gets ``_1``, ``_2``... as in ``toc``. Fenced code is no heading."""
    found: set[str] = set()
    for heading in HEADING.findall(FENCE.sub("", page.read_text(encoding="utf-8"))):
        attrs = ATTR_LIST.search(heading)
        explicit = re.search(r"#([\w-]+)", attrs.group(1)) if attrs else None
        if explicit:
            found.add(explicit.group(1))
            continue
        base = anchor = slug(heading[:attrs.start()] if attrs else heading)
        n = 0
        while anchor in found:
            n += 1
            anchor = f"{base}_{n}"
        found.add(anchor)
    return found


def docs_pointers(text: str) -> list[tuple[int, str, str]]:
    """(line, page under docs/, anchor) of every ``docs/<page>.md#<anchor>`` in ``text``."""
    return [(text.count("\n", 0, m.start()) + 1, m.group(1), m.group(2))
            for m in POINTER.finditer(text)]


def test_heading_anchors_follow_the_toc_rules(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("# `ctx.ui`\n\n## Deadline (--max-time)\n\n### The editor's terminals\n\n"
                    "## What differs from the original, and why\n\n## Abort\n\n## Abort ##\n\n"
                    "### `prompt` {#prompt}\n\n### `get_state` before the first call\n\n"
                    "```bash\n# not a heading\n```\n")
    assert heading_anchors(page) == {
        "ctxui", "deadline-max-time", "the-editors-terminals",
        "what-differs-from-the-original-and-why", "abort", "abort_1", "prompt",
        "get_state-before-the-first-call"}


def test_the_pointer_finder_finds_pointers() -> None:
    d = "docs"  # spelled apart, or this file's own examples would be checked as pointers
    text = (f"# See {d}/guides/acp.md#errors, and\n# ({d}/design/x.md#gone); "
            f"not ../{d}/y.md#z, {d}/index.md or my{d}/a.md#b.")
    assert docs_pointers(text) == [(1, "guides/acp.md", "errors"), (2, "design/x.md", "gone")]


def test_every_docs_pointer_in_the_code_leads_to_a_heading() -> None:
    """Comments and docstrings cite the design by ``docs/<page>.md#<anchor>`` (issue 39: the
    pages of the repository, or nothing). Each one names a page of docs/ and a heading on it,
    so a page that renames or drops a heading fails here until its citations follow."""
    anchors: dict[Path, set[str]] = {}
    found, broken = 0, []
    for path in sorted(p for d in CODE_DIRS for p in (ROOT / d).rglob("*.py")):
        for line, page, anchor in docs_pointers(path.read_text(encoding="utf-8")):
            found += 1
            target = ROOT / "docs" / page
            if target not in anchors:
                anchors[target] = heading_anchors(target) if target.is_file() else set()
            if anchor not in anchors[target]:
                broken.append(f"{path.relative_to(ROOT)}:{line}: docs/{page}#{anchor}")
    assert found  # the walk found the citations
    assert not broken, "no such page or heading:\n" + "\n".join(broken)


def test_the_frame_reference_is_current() -> None:
    done = subprocess.run([sys.executable, str(ROOT / "docs" / "gen_reference.py"), "--check"],
                          capture_output=True, text=True, timeout=120, check=False)
    assert done.returncode == 0, done.stderr


TRANSCRIPT_LINE = re.compile(r"^\s*(→|←)\s*(\{.*\})\s*$")
ABRIDGED = re.compile(r"…|\{\w+\}")
"""What marks a shortened frame: an ellipsis, or a placeholder such as ``{user}``."""


def transcript_frames(page: Path) -> list[tuple[int, str, str]]:
    """(line number, "in" | "out", the JSON) of every ``→ {...}`` / ``← {...}`` line."""
    found = []
    for number, line in enumerate(page.read_text().splitlines(), 1):
        if match := TRANSCRIPT_LINE.match(line):
            found.append((number, "in" if match.group(1) == "→" else "out", match.group(2)))
    return found


@pytest.mark.parametrize("page", [p for p in PAGES if transcript_frames(p)],
                         ids=lambda p: str(p.relative_to(ROOT)))
def test_transcript_frames_match_the_schema(page: Path) -> None:
    """The example exchanges (``→`` host to server, ``←`` server to host) are real frames. Lines
    shortened (``…``, ``{user}``) are skipped; a command that does not match must be one the example
    shows refused (its response with the same id has ``success: false``)."""
    from schema_helpers import shared_validator

    validator = shared_validator()
    frames = transcript_frames(page)
    checked, problems = 0, []
    refused = {frame.get("id") for frame in (json.loads(text) for _, d, text in frames
                                             if d == "out" and not ABRIDGED.search(text))
               if frame.get("type") == "response" and frame.get("success") is False}
    for number, direction, text in frames:
        if ABRIDGED.search(text):
            continue
        frame = json.loads(text)  # anything else must be valid JSON
        found = validator.problems(frame, direction)  # type: ignore[arg-type]
        checked += 1
        if found and not (direction == "in" and frame.get("id") in refused):
            problems.append(f"line {number}: {found}")
    assert checked
    assert not problems, "\n".join(problems)


def test_every_command_has_an_example_the_schema_accepts() -> None:
    from schema_helpers import shared_validator

    from omp.protocol.schema import command_tags

    generator = load_repo_file("docs/gen_reference.py")
    assert set(generator.EXAMPLES) == set(command_tags())
    validator = shared_validator()
    for tag in generator.EXAMPLES:
        assert not validator.problems(generator.example_frame(tag), "in"), tag
