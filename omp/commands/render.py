"""The last two steps of expanding a command or template body: Handlebars, then the prompt
formatter (docs/design/extending.md#arguments).

The original renders every expanded body as a Handlebars template (no HTML escaping) with the
context ``{args, ARGUMENTS, arguments}``, then runs its prompt formatter. Bodies written for it
may use either, so both are here; a body that uses neither comes out as it went in, apart from
the formatter's whitespace rules.

**The Handlebars subset.** ``{{path}}`` and ``{{{path}}}`` (``args``, ``ARGUMENTS``,
``arguments``, ``this``, ``@index``/``@first``/``@last``/``@key``, ``@root.x``, ``../x``,
``x.length``, ``args.[0]``); comments ``{{! }}`` / ``{{!-- --}}``; ``\\{{`` for a literal
``{{``; ``~`` whitespace control; blocks ``#if``, ``#unless``, ``#each``, ``#with``, ``^x``
(inverted section) and the original's ``#list items prefix= suffix= join=``, with ``{{else}}``
and ``{{else if …}}`` chains; the original's helpers ``arg N``, ``join``, ``default``, ``len``,
``not``, ``add``, ``sub``, ``jsonStringify``. A tag alone on its line (block, ``else``,
comment) takes the line with it, as in Handlebars. A name that resolves to nothing renders as
``""`` (Handlebars without strict mode), so a GitHub ``${{ secrets.X }}`` renders as ``$``
exactly as in the original.
Partials, sub-expressions, block parameters and helpers not listed here raise ``TemplateError``
naming the line: a clear error rather than a text that differs from the original's.

**The formatter** (``format_prompt``), outside fenced code blocks: trailing whitespace is cut, a
single blank line is kept but a run of two or more is removed entirely, leading and trailing
blank lines go, blank lines before a closing ``</tag>`` line go, and Markdown table rows are
compacted (``| a | b |`` → ``|a|b|``). Inside fences only trailing whitespace is cut.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .problems import TemplateError as TemplateError

# --- the formatter -------------------------------------------------------------------------

_TABLE_ROW = re.compile(r"^\|.*\|$")
_TABLE_SEP = re.compile(r"^\|[-:\s|]+\|$")
_CLOSING_TAG = re.compile(r"^</[a-z_-]+>$")


def format_prompt(text: str) -> str:
    """``text`` with the original's prompt whitespace rules applied (see the module doc)."""
    lines = text.split("\n")
    out: list[str] = []
    in_code = False
    index = 0
    while index < len(lines):
        line = lines[index].rstrip()
        body = line.lstrip(" \t")
        if body and ord(body[0]) >= 128:
            body = body.lstrip()  # Unicode spaces count as indentation too
        indent = line[:len(line) - len(body)]
        index += 1
        if body.startswith(("```", "~~~")):
            in_code = not in_code
            out.append(line)
            continue
        if in_code:
            out.append(line)
            continue
        closing = body.startswith("</") and _CLOSING_TAG.match(body) is not None
        if body.startswith("|"):
            if _TABLE_SEP.match(body):
                line = indent + _compact_separator(body)
            elif _TABLE_ROW.match(body):
                line = indent + "|".join(cell.strip() for cell in body.split("|"))
        if not line:
            if index >= len(lines) or not lines[index].strip():
                # A run of blank lines (or blank lines at the end) goes entirely.
                _drop_blank_tail(out)
                while index < len(lines) and not lines[index].strip():
                    index += 1
                continue
            if not out or not out[-1]:
                continue
        if closing:
            _drop_blank_tail(out)
        out.append(line)
    _drop_blank_tail(out)
    return "\n".join(out)


def _drop_blank_tail(out: list[str]) -> None:
    while out and not out[-1]:
        out.pop()


def _compact_separator(row: str) -> str:
    cells = []
    for cell in (c.strip() for c in row.split("|")):
        if not cell:
            continue
        left, right = cell.startswith(":"), cell.endswith(":")
        cells.append(":---:" if left and right else ":---" if left else "---:" if right
                     else "---")
    return f"|{'|'.join(cells)}|"


# --- Handlebars: tokens --------------------------------------------------------------------

_MUSTACHE = re.compile(
    r"""\{\{(?:
        \{(?P<t_open>~?)(?P<triple>.*?)(?P<t_close>~?)\}\}\}
      | (?P<c_open>~?)!--(?P<long_comment>.*?)--(?P<lc_close>~?)\}\}
      | (?P<s_open>~?)!(?P<comment>.*?)(?P<sc_close>~?)\}\}
      | (?P<open>~?)(?P<body>.*?)(?P<close>~?)\}\}
    )""",
    re.DOTALL | re.VERBOSE,
)
_STANDALONE_KINDS = frozenset({"open", "close", "else", "comment"})


# The parse classes below are plain slotted classes, not attrs ones: this module is imported at
# startup (with the command list), and each attrs class costs a fraction of a millisecond there.


class _Tag:
    __slots__ = ("body", "kind", "pos", "strip_after", "strip_before")

    def __init__(self, kind: str, body: str, pos: int, strip_before: bool,
                 strip_after: bool) -> None:
        self.kind = kind  # "var", "open", "close", "else", "comment"
        self.body = body
        self.pos = pos
        self.strip_before = strip_before
        self.strip_after = strip_after


def _tokenize(source: str) -> tuple[list[str], list[_Tag]]:
    """The texts and the tags between them: ``tags[i]`` stands between ``texts[i]`` and
    ``texts[i + 1]`` (a text may be empty)."""
    texts: list[str] = []
    tags: list[_Tag] = []
    text: list[str] = []
    pos = 0
    while (start := source.find("{{", pos)) >= 0:
        backslashes = len(source[pos:start]) - len(source[pos:start].rstrip("\\"))
        if backslashes % 2 == 1:  # \{{ is a literal {{ (and \\{{ a backslash, then a tag)
            text.append(source[pos:start - 1] + "{{")
            pos = start + 2
            continue
        text.append(source[pos:start - backslashes // 2])
        match = _MUSTACHE.match(source, start)
        if match is None:
            raise TemplateError(f"line {_line(source, start)}: '{{{{' is never closed by '}}}}'")
        texts.append("".join(text))
        text = []
        tags.append(_classify(match, start, source))
        pos = match.end()
    text.append(source[pos:])
    texts.append("".join(text))
    _standalone(texts, tags)
    for index, tag in enumerate(tags):
        if tag.strip_before:
            texts[index] = texts[index].rstrip()
        if tag.strip_after:
            texts[index + 1] = texts[index + 1].lstrip()
    return texts, tags


def _classify(match: re.Match[str], start: int, source: str) -> _Tag:
    if match["triple"] is not None:
        return _Tag("var", match["triple"].strip(), start, bool(match["t_open"]),
                    bool(match["t_close"]))
    if match["long_comment"] is not None:
        return _Tag("comment", "", start, bool(match["c_open"]), bool(match["lc_close"]))
    if match["comment"] is not None:
        return _Tag("comment", "", start, bool(match["s_open"]), bool(match["sc_close"]))
    body = match["body"].strip()
    strip_before, strip_after = bool(match["open"]), bool(match["close"])
    if body.startswith(("#>", "#*", ">")):
        raise TemplateError(f"line {_line(source, start)}: partials are not supported "
                            f"({{{{{body}}}}})")
    if body.startswith("#"):
        helper_and_args = " ".join(body[1:].split(None, 1))
        return _Tag("open", helper_and_args, start, strip_before, strip_after)
    if body.startswith("/"):
        return _Tag("close", body[1:].strip(), start, strip_before, strip_after)
    if body == "^" or body == "else" or body.startswith(("else ", "else\t", "else\n")):
        chain = "" if body == "^" else " ".join(body[4:].split(None, 1))
        return _Tag("else", chain, start, strip_before, strip_after)
    if body.startswith("^"):
        return _Tag("open", "^ " + body[1:].strip(), start, strip_before, strip_after)
    return _Tag("var", body.removeprefix("&").strip(), start, strip_before, strip_after)


def _standalone(texts: list[str], tags: list[_Tag]) -> None:
    """A block, ``else`` or comment tag alone on its line removes that line (its indent and
    newline), decided on the text as written before any of it is removed."""
    standalone = []
    for index, tag in enumerate(tags):
        if tag.kind not in _STANDALONE_KINDS:
            continue
        before, after = texts[index], texts[index + 1]
        line_start = (re.search(r"\n[ \t]*\Z", before) is not None
                      or (index == 0 and re.fullmatch(r"[ \t]*", before) is not None))
        line_end = (re.match(r"[ \t]*\r?\n", after) is not None
                    or (index == len(tags) - 1 and re.fullmatch(r"[ \t]*", after) is not None))
        if line_start and line_end:
            standalone.append(index)
    for index in standalone:
        texts[index] = re.sub(r"[ \t]*\Z", "", texts[index])
        texts[index + 1] = re.sub(r"\A[ \t]*(\r?\n)?", "", texts[index + 1], count=1)


def _line(source: str, pos: int) -> int:
    return source.count("\n", 0, pos) + 1


# --- Handlebars: expressions ---------------------------------------------------------------


class _Path:
    __slots__ = ("data", "depth", "parts")

    def __init__(self, parts: tuple[str, ...], depth: int = 0, data: bool = False) -> None:
        self.parts = parts
        self.depth = depth  # how many ``../``
        self.data = data  # ``@name``


class _Call:
    """``head param… key=value…``: a lookup when there are no params or hash, else a helper."""

    __slots__ = ("hash", "head", "params")

    def __init__(self, head: Any, params: tuple[Any, ...] = (),
                 hash_pairs: tuple[tuple[str, Any], ...] = ()) -> None:
        self.head = head  # a _Path or a literal
        self.params = params
        self.hash = hash_pairs


_EXPR_TOKEN = re.compile(
    r"""\s*(?:
        (?P<key>[A-Za-z_][\w-]*)=
      | (?P<string>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')
      | (?P<number>-?\d+(?:\.\d+)?)(?=\s|$)
      | (?P<path>[^\s=()"'|]+)
      | (?P<bad>\S)
    )""",
    re.VERBOSE,
)
_LITERALS: dict[str, Any] = {"true": True, "false": False, "null": None, "undefined": None}


def _parse_call(text: str, line: int) -> _Call:
    values: list[Any] = []
    hash_pairs: list[tuple[str, Any]] = []
    pending_key: str | None = None
    pos = 0
    while pos < len(text) and text[pos:].strip():
        match = _EXPR_TOKEN.match(text, pos)
        assert match is not None  # "bad" matches any other character
        pos = match.end()
        if match["key"]:
            if pending_key is not None:
                raise TemplateError(f"line {line}: {pending_key}= has no value in {{{{{text}}}}}")
            pending_key = match["key"]
            continue
        if match["bad"]:
            what = ("sub-expressions are" if match["bad"] in "()" else
                    "block parameters are" if match["bad"] == "|" else
                    f"{match['bad']!r} is")
            raise TemplateError(f"line {line}: {what} not supported in {{{{{text}}}}}")
        if match["string"]:
            value: Any = _unquote(match["string"])
        elif match["number"]:
            number = match["number"]
            value = float(number) if "." in number else int(number)
        else:
            path = match["path"]
            value = _LITERALS[path] if path in _LITERALS else _parse_path(path, line)
        if pending_key is not None:
            hash_pairs.append((pending_key, value))
            pending_key = None
        elif hash_pairs:
            raise TemplateError(f"line {line}: a parameter after key=value in {{{{{text}}}}}")
        else:
            values.append(value)
    if pending_key is not None:
        raise TemplateError(f"line {line}: {pending_key}= has no value in {{{{{text}}}}}")
    if not values:
        raise TemplateError(f"line {line}: an empty tag {{{{{text}}}}}")
    return _Call(values[0], tuple(values[1:]), tuple(hash_pairs))


def _unquote(literal: str) -> str:
    # As in Handlebars, the only escape in a string literal is its own quote (\" or \').
    quote = literal[0]
    return literal[1:-1].replace("\\" + quote, quote)


def _parse_path(text: str, line: int) -> _Path:
    data = text.startswith("@")
    rest = text[1:] if data else text
    depth = 0
    while rest.startswith("../"):
        depth += 1
        rest = rest[3:]
    rest = rest.removeprefix("./")
    parts = []
    for part in re.findall(r"\[[^\]]*\]|[^./\[]+", rest):
        parts.append(part[1:-1] if part.startswith("[") else part)
    if not parts and rest not in ("", "."):
        raise TemplateError(f"line {line}: cannot read the name {text!r}")
    if parts and parts[0] == "this" and not data:
        parts = parts[1:]
    return _Path(tuple(parts), depth, data)


# --- Handlebars: the tree ------------------------------------------------------------------


class _Var:
    __slots__ = ("call", "line")

    def __init__(self, call: _Call, line: int) -> None:
        self.call = call
        self.line = line


class _Block:
    __slots__ = ("body", "call", "helper", "inverse", "line")

    def __init__(self, helper: str, call: _Call | None, line: int) -> None:
        self.helper = helper
        self.call = call  # None for a block helper given no arguments
        self.line = line
        self.body: list[_Node] = []
        self.inverse: list[_Node] | None = None


_Node = str | _Var | _Block


def _build(texts: list[str], tags: list[_Tag], source: str) -> list[_Node]:
    root: list[_Node] = []
    # Each open block: (block, where its nodes go now, the name its {{/name}} must give).
    stack: list[tuple[_Block, list[_Node], str]] = []
    target = root
    for index, item in enumerate(tags):
        if texts[index]:
            target.append(texts[index])
        line = _line(source, item.pos)
        if item.kind == "comment":
            continue
        if item.kind == "var":
            target.append(_Var(_parse_call(item.body, line), line))
        elif item.kind == "open":
            block = _open_block(item.body, line)
            target.append(block)
            stack.append((block, block.body, block.helper if block.helper != "^" else
                          _path_name(block)))
            target = block.body
        elif item.kind == "else":
            if not stack:
                raise TemplateError(f"line {line}: {{{{else}}}} outside a block")
            block, _, close_name = stack[-1]
            if block.inverse is not None:
                raise TemplateError(f"line {line}: a second {{{{else}}}} in "
                                    f"{{{{#{block.helper}}}}}")
            block.inverse = []
            if item.body:  # {{else if x}}: a block inside the inverse, closed by the same tag
                chained = _open_block(item.body, line)
                block.inverse.append(chained)
                stack[-1] = (chained, chained.body, close_name)
                target = chained.body
            else:
                stack[-1] = (block, block.inverse, close_name)
                target = block.inverse
        else:  # close
            if not stack:
                raise TemplateError(f"line {line}: {{{{/{item.body}}}}} closes nothing")
            block, _, close_name = stack.pop()
            if item.body != close_name:
                raise TemplateError(f"line {line}: {{{{/{item.body}}}}} does not close "
                                    f"{{{{#{close_name}}}}} (line {block.line})")
            target = stack[-1][1] if stack else root
    if texts[-1]:
        target.append(texts[-1])
    if stack:
        block, _, close_name = stack[-1]
        raise TemplateError(f"line {block.line}: {{{{#{close_name}}}}} is never closed")
    return root


def _open_block(body: str, line: int) -> _Block:
    helper, _, rest = body.partition(" ")
    if helper not in _BLOCK_HELPERS:
        raise TemplateError(f"line {line}: unknown block helper #{helper}")
    call = _parse_call(rest.strip(), line) if rest.strip() else None
    if helper == "list":
        if call is None or call.params:
            raise TemplateError(f"line {line}: #list takes one list and key=value options")
    elif call is None or call.params or call.hash:
        raise TemplateError(f"line {line}: #{helper} takes exactly one argument")
    return _Block(helper, call, line)


def _path_name(block: _Block) -> str:
    head = block.call.head if block.call is not None else None
    return ".".join(head.parts) if isinstance(head, _Path) else ""


# --- Handlebars: rendering -----------------------------------------------------------------


class _Frame:
    __slots__ = ("data", "parent", "root", "value")

    def __init__(self, value: Any, data: Mapping[str, Any], parent: _Frame | None,
                 root: Any) -> None:
        self.value = value
        self.data = data
        self.parent = parent
        self.root = root


def render_handlebars(source: str, context: Mapping[str, Any]) -> str:
    """``source`` rendered with ``context`` (no HTML escaping). Raises TemplateError."""
    nodes = _build(*_tokenize(source), source)
    return _render(nodes, _Frame(context, {}, None, context))


def _render(nodes: Sequence[_Node], frame: _Frame) -> str:
    out: list[str] = []
    for node in nodes:
        if isinstance(node, str):
            out.append(node)
        elif isinstance(node, _Var):
            out.append(_to_string(_call(node.call, frame, node.line)))
        else:
            out.append(_BLOCK_HELPERS[node.helper](node, frame))
    return "".join(out)


def _call(call: _Call, frame: _Frame, line: int) -> Any:
    if not call.params and not call.hash:
        return _value(call.head, frame)
    head = call.head
    name = ".".join(head.parts) if isinstance(head, _Path) and not head.data else None
    helper = _HELPERS.get(name or "")
    if helper is None:
        raise TemplateError(f"line {line}: unknown helper {name or head!r}")
    params = [_value(param, frame) for param in call.params]
    hash_values = {key: _value(value, frame) for key, value in call.hash}
    return helper(frame, params, hash_values)


def _value(expr: Any, frame: _Frame) -> Any:
    if not isinstance(expr, _Path):
        return expr
    if expr.data:
        if expr.parts and expr.parts[0] == "root":
            value = frame.root
            parts = expr.parts[1:]
        else:
            found: _Frame | None = frame
            while found is not None and (not expr.parts or expr.parts[0] not in found.data):
                found = found.parent
            if found is None or not expr.parts:
                return None
            value = found.data[expr.parts[0]]
            parts = expr.parts[1:]
    else:
        target = frame
        for _ in range(expr.depth):
            target = target.parent or target
        value = target.value
        parts = expr.parts
    for part in parts:
        value = _property(value, part)
    return value


def _property(value: Any, name: str) -> Any:
    if isinstance(value, Mapping):
        return value.get(name)
    if isinstance(value, (list, tuple, str)):
        if name == "length":
            return len(value)
        if name.isdigit() and int(name) < len(value):
            return value[int(name)]
    return None


def _to_string(value: Any) -> str:
    """As JavaScript's ``String()`` would say it (Handlebars' output for a value)."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return str(int(value)) if value.is_integer() else repr(value)
    if isinstance(value, (list, tuple)):
        return ",".join(_to_string(item) for item in value)
    if isinstance(value, Mapping):
        return "[object Object]"
    return str(value)


def _truthy(value: Any) -> bool:
    """JavaScript truthiness."""
    if isinstance(value, (list, tuple, Mapping)):
        return True
    return bool(value)


def _empty(value: Any) -> bool:
    """What ``#if`` treats as false: JavaScript-falsy, or an empty array."""
    if isinstance(value, (list, tuple)):
        return not value
    return not _truthy(value)


def _block_if(block: _Block, frame: _Frame) -> str:
    assert block.call is not None
    condition = _call(block.call, frame, block.line)
    negate = block.helper in ("unless", "^")
    if _empty(condition) != negate:
        return _render(block.inverse or [], frame)
    return _render(block.body, frame)


def _block_with(block: _Block, frame: _Frame) -> str:
    assert block.call is not None
    value = _call(block.call, frame, block.line)
    if _empty(value):
        return _render(block.inverse or [], frame)
    return _render(block.body, _Frame(value, {}, frame, frame.root))


def _block_each(block: _Block, frame: _Frame) -> str:
    assert block.call is not None
    value = _call(block.call, frame, block.line)
    if isinstance(value, Mapping):
        entries = [(key, item, {"key": key}) for key, item in value.items()]
    elif isinstance(value, (list, tuple)):
        entries = [(index, item, {}) for index, item in enumerate(value)]
    else:
        entries = []
    if not entries:
        return _render(block.inverse or [], frame)
    out = []
    for position, (_, item, extra) in enumerate(entries):
        data = {"index": position, "first": position == 0, "last": position == len(entries) - 1,
                **extra}
        out.append(_render(block.body, _Frame(item, data, frame, frame.root)))
    return "".join(out)


def _block_list(block: _Block, frame: _Frame) -> str:
    """The original's ``{{#list items prefix="- " suffix="" join="\\n"}}…{{/list}}``."""
    if block.call is None:
        return ""
    items = _value(block.call.head, frame)
    options = {key: _value(value, frame) for key, value in block.call.hash}
    if not isinstance(items, (list, tuple)) or not items:
        return ""
    prefix, suffix = _to_string(options.get("prefix")), _to_string(options.get("suffix"))
    join = options.get("join")
    separator = "\n" if join is None else _to_string(join).replace("\\n", "\n").replace(
        "\\t", "\t")
    return separator.join(f"{prefix}{_render(block.body, _Frame(item, {}, frame, frame.root))}"
                          f"{suffix}" for item in items)


_BLOCK_HELPERS: dict[str, Callable[[_Block, _Frame], str]] = {
    "if": _block_if, "unless": _block_if, "^": _block_if, "with": _block_with,
    "each": _block_each, "list": _block_list,
}


def _helper_arg(frame: _Frame, params: list[Any], _: dict[str, Any]) -> Any:
    args = frame.value.get("args") if isinstance(frame.value, Mapping) else None
    index = params[0] if params else None
    if isinstance(index, str):  # as JavaScript's parseInt reads it: leading digits
        digits = re.match(r"\s*([+-]?\d+)", index)
        index = int(digits[1]) if digits else None
    if isinstance(index, float) and index.is_integer():
        index = int(index)
    if not isinstance(index, int) or isinstance(index, bool):
        return ""
    position = index - 1
    if position < 0 or not isinstance(args, (list, tuple)) or position >= len(args):
        return ""
    return args[position]


def _helper_join(_frame: _Frame, params: list[Any], _: dict[str, Any]) -> Any:
    items = params[0] if params else None
    if not isinstance(items, (list, tuple)):
        return ""
    separator = params[1] if len(params) > 1 else None
    sep = separator.replace("\\n", "\n").replace("\\t", "\t") if isinstance(separator, str) \
        else ", "
    return sep.join(_to_string(item) for item in items)


def _number(value: Any) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) \
        else 0.0


def _arithmetic(sign: int) -> Callable[[_Frame, list[Any], dict[str, Any]], Any]:
    def helper(_frame: _Frame, params: list[Any], _: dict[str, Any]) -> Any:
        a = _number(params[0] if params else None)
        b = _number(params[1] if len(params) > 1 else None)
        result = a + sign * b
        return int(result) if result.is_integer() else result
    return helper


_HELPERS: dict[str, Callable[[_Frame, list[Any], dict[str, Any]], Any]] = {
    "arg": _helper_arg,
    "join": _helper_join,
    "default": lambda _f, p, _h: p[0] if p and _truthy(p[0]) else (p[1] if len(p) > 1 else None),
    "len": lambda _f, p, _h: len(p[0]) if p and isinstance(p[0], (list, tuple, str)) else 0,
    "not": lambda _f, p, _h: not (p and _truthy(p[0])),
    "add": _arithmetic(1),
    "sub": _arithmetic(-1),
    "jsonStringify": lambda _f, p, _h: json.dumps(p[0] if p else None, separators=(",", ":")),
}
