"""omp/commands/templates.py and render.py: ``/name args`` → the text sent to the model
(docs/design/extending.md#arguments): argument splitting, every ``$`` placeholder, the
appended-args fallback, the Handlebars subset and the prompt formatter. Pure functions, no I/O."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from omp.commands.render import TemplateError, format_prompt, render_handlebars
from omp.commands.templates import (
    expand,
    parse_args,
    split_command,
    substitute_args,
    uses_arg_placeholders,
)

# --- /name args -----------------------------------------------------------------------------


@pytest.mark.parametrize(("text", "parts"), [
    ("/review src/a.py perf", ("review", "src/a.py perf")),
    ("/review", ("review", "")),
    ("/review ", ("review", "")),
    ("/review  two spaces", ("review", " two spaces")),
    ("/a:b x", ("a:b", "x")),
    # Only a space ends the name, as in the original: this names no command.
    ("/review\tx", ("review\tx", "")),
    ("/review\nmore", ("review\nmore", "")),
    ("review x", None),
    (" /review x", None),
    ("", None),
])
def test_split_command(text: str, parts: tuple[str, str] | None) -> None:
    assert split_command(text) == parts


# --- argument splitting ---------------------------------------------------------------------


@pytest.mark.parametrize(("text", "args"), [
    ("", []),
    ("   ", []),
    ("a b c", ["a", "b", "c"]),
    ("a   b\t\tc", ["a", "b", "c"]),
    ('src/a.py "error handling" perf', ["src/a.py", "error handling", "perf"]),
    ("'single quoted' x", ["single quoted", "x"]),
    ("\"it's\" 'say \"hi\"'", ["it's", 'say "hi"']),
    ('pre"fix and"post', ["prefix andpost"]),
    ('"unclosed quote runs to the end', ["unclosed quote runs to the end"]),
    ('a "" b', ["a", "b"]),  # an empty word is dropped
    ("line\nbreak", ["line\nbreak"]),  # newlines are not separators
    ('"keep \\" no escapes"', ["keep \\", "no", "escapes"]),
    ("tab\tinside 'quoted\ttab'", ["tab", "inside", "quoted\ttab"]),
])
def test_parse_args(text: str, args: list[str]) -> None:
    assert parse_args(text) == args


_WORDS = st.lists(st.text(alphabet=st.characters(exclude_characters=" \t'\"",
                                                 exclude_categories=["Cs"]), min_size=1),
                  max_size=6)


@settings(max_examples=300)
@given(_WORDS, st.sampled_from(['"', "'"]))
def test_parse_args_round_trip(words: list[str], quote: str) -> None:
    assert parse_args(" ".join(words)) == words
    assert parse_args("\t".join(f"{quote}{w} {w}{quote}" for w in words)) == [
        f"{w} {w}" for w in words]


# --- $ placeholders -------------------------------------------------------------------------

ARGS = ["one", "two words", "three", "four"]


@pytest.mark.parametrize(("body", "result"), [
    ("$1", "one"),
    ("$2", "two words"),
    ("$4", "four"),
    ("$5", ""),  # missing
    ("$0", ""),  # there is no arg 0
    ("[$1][$2]", "[one][two words]"),
    ("$1$2", "onetwo words"),
    ("$@", "one two words three four"),
    ("$ARGUMENTS", "one two words three four"),
    ("all: $ARGUMENTS.", "all: one two words three four."),
    ("$@[1]", "one two words three four"),
    ("$@[2]", "two words three four"),
    ("$@[4]", "four"),
    ("$@[5]", ""),  # past the end
    ("$@[0]", ""),  # N < 1
    ("$@[2:]", "two words three four"),
    ("$@[2:1]", "two words"),
    ("$@[2:2]", "two words three"),
    ("$@[3:10]", "three four"),
    ("$@[2:0]", ""),  # L <= 0
    ("$@[0:2]", ""),
    ("$@[9:1]", ""),
    # Not ours: shell forms stay as written.
    ("${1}", "${1}"),
    ("${@:2}", "${@:2}"),
    ("$*", "$*"),
    ("$HOME", "$HOME"),
    ("cost: $", "cost: $"),
    # $@ followed by something that is not an index: $@ is replaced, the rest stays.
    ("$@[1:-1]", "one two words three four[1:-1]"),
    ("$@[x]", "one two words three four[x]"),
])
def test_substitute_args(body: str, result: str) -> None:
    assert substitute_args(body, ARGS) == result


def test_positional_args_past_nine() -> None:
    args = [str(n) for n in range(1, 12)]
    assert substitute_args("$9 $10 $11 $12", args) == "9 10 11 "


def test_values_are_not_substituted_again() -> None:
    assert substitute_args("$1 and $2", ["$2", "$ARGUMENTS"]) == "$2 and $ARGUMENTS"
    assert substitute_args("$@", ["$1", "$@"]) == "$1 $@"


def test_no_args_leave_placeholders_empty() -> None:
    assert substitute_args("[$1] [$@] [$ARGUMENTS] [$@[1]] [$@[1:2]]", []) == "[] [] [] [] []"


@pytest.mark.parametrize(("body", "uses"), [
    ("$1", True),
    ("x $10 y", True),
    ("$@", True),
    ("$ARGUMENTS", True),
    ("$@[2]", True),
    ("$@[2:3]", True),
    ("{{args}}", True),
    ("{{ARGUMENTS}}", True),
    ("{{arguments}}", True),
    ("{{arg 1}}", True),
    ("{{#each args}}{{this}}{{/each}}", True),
    ("{{#if args}}x{{/if}}", True),
    ("plain text", False),
    ("${1} and $* and $HOME", False),
    ("cost: 5$", False),
    ("{{name}}", False),
    ("{{argument}}", False),
    ("args without braces", False),
])
def test_uses_arg_placeholders(body: str, uses: bool) -> None:
    assert uses_arg_placeholders(body) is uses


# --- expand: the whole of docs/design/extending.md#arguments -------------------------------------


def test_spec_examples() -> None:
    name, args = split_command('/review-file src/a.py "error handling" perf') or ("", "")
    assert name == "review-file"
    assert expand("Review $1 focusing on $@[2]", args) == (
        "Review src/a.py focusing on error handling perf")
    name, args = split_command("/sum quickly") or ("", "")
    assert expand("Summarise the diff", args) == "Summarise the diff\n\nquickly"


def test_args_appended_only_without_placeholders() -> None:
    assert expand("Summarise", 'a "b c"') == "Summarise\n\na b c"
    assert expand("Summarise", "") == "Summarise"
    assert expand("Summarise", "   ") == "Summarise"
    assert expand("", "only args") == "only args"
    # A placeholder anywhere means the body places its args: extra ones are not appended.
    assert expand("First: $1", "a b c") == "First: a"
    assert expand("Missing: [$3]", "a") == "Missing: []"
    assert expand("Handlebars: {{arg 2}}", "a b c") == "Handlebars: b"


def test_frontmatter_example_of_the_spec() -> None:
    body = "Write a commit message for scope $1. Extra notes: $@[2]"
    assert expand(body, "parser keep it short") == (
        "Write a commit message for scope parser. Extra notes: keep it short")


def test_expansion_runs_the_formatter() -> None:
    body = "Line one   \n\n\n\nLine two\n| a |  b |\n|---|:-:|\n"
    assert expand(body, "") == "Line one\nLine two\n|a|b|\n|---|:---:|"


def test_args_are_rendered_after_substitution() -> None:
    # As in the original: substituted text goes through Handlebars too.
    assert expand("$1", "{{ARGUMENTS}}") == "{{ARGUMENTS}}"
    assert expand("$1", "'{{arguments}}'") == "{{arguments}}"
    assert expand("x $@", "{{missing}}") == "x"


def test_handlebars_context() -> None:
    body = "{{ARGUMENTS}}|{{arguments}}|{{args}}|{{args.length}}|{{args.[1]}}|{{arg 3}}|{{arg 9}}"
    assert expand(body, 'a "b c" d') == "a b c d|a b c d|a,b c,d|3|b c|d|"


def test_expand_reports_broken_handlebars() -> None:
    with pytest.raises(TemplateError, match=r"line 2: \{\{#if\}\} is never closed"):
        expand("ok\n{{#if args}}never closed", "x")


# --- Handlebars -----------------------------------------------------------------------------

CONTEXT = {"args": ["a", "b c", "d"], "ARGUMENTS": "a b c d", "arguments": "a b c d"}
EMPTY = {"args": [], "ARGUMENTS": "", "arguments": ""}


@pytest.mark.parametrize(("source", "result"), [
    ("plain", "plain"),
    ("{{ARGUMENTS}}", "a b c d"),
    ("{{{ARGUMENTS}}}", "a b c d"),
    ("{{&ARGUMENTS}}", "a b c d"),
    ("{{ ARGUMENTS }}", "a b c d"),
    ("<{{args}}>", "<a,b c,d>"),
    ("{{args.length}} {{args.0}} {{args.[2]}} {{args.9}}", "3 a d "),
    ("{{nothing}}|{{nothing.deeper}}", "|"),
    ("Deploy ${{ secrets.TOKEN }}", "Deploy $"),
    ("{{arg 1}}-{{arg 2}}-{{arg \"3\"}}-{{arg 0}}-{{arg 4}}", "a-b c-d--"),
    ("{{join args \" / \"}}", "a / b c / d"),
    ("{{join args}}", "a, b c, d"),
    ("{{len args}} {{len ARGUMENTS}}", "3 7"),
    ("{{default nothing \"fallback\"}} {{default ARGUMENTS \"x\"}}", "fallback a b c d"),
    ("{{default nothing \"say \\\"hi\\\"\"}} {{default nothing 'it\\'s'}}", 'say "hi" it\'s'),
    ("{{not nothing}} {{not args}}", "true false"),
    ("{{add 2 3}} {{sub 2 3}} {{add 1.5 1}}", "5 -1 2.5"),
    ("{{jsonStringify args}}", '["a","b c","d"]'),
    ("{{#if args}}yes{{else}}no{{/if}}", "yes"),
    ("{{#if nothing}}yes{{else}}no{{/if}}", "no"),
    ("{{#unless nothing}}yes{{/unless}}", "yes"),
    ("{{^nothing}}inverted{{/nothing}}", "inverted"),
    ("{{#if nothing}}1{{else if args}}2{{else}}3{{/if}}", "2"),
    ("{{#if nothing}}1{{else if nothing}}2{{else}}3{{/if}}", "3"),
    ("{{#if nothing}}1{{^}}2{{/if}}", "2"),
    ("{{#each args}}[{{@index}}:{{this}}{{#if @first}}!{{/if}}{{#if @last}}.{{/if}}]{{/each}}",
     "[0:a!][1:b c][2:d.]"),
    ("{{#each args}}{{ARGUMENTS}}{{../ARGUMENTS}}{{@root.ARGUMENTS}};{{/each}}",
     "a b c da b c d;a b c da b c d;a b c da b c d;"),
    ("{{#each nothing}}x{{else}}none{{/each}}", "none"),
    ("{{#with args}}{{length}}{{/with}}", "3"),
    ('{{#list args prefix="- " join="\\n"}}{{this}}{{/list}}', "- a\n- b c\n- d"),
    ('{{#list args join=", "}}<{{this}}>{{/list}}', "<a>, <b c>, <d>"),
    ("{{#list nothing}}x{{/list}}", ""),
    ("a{{! a comment }}b{{!-- a comment with }} inside --}}c", "abc"),
    ("\\{{ARGUMENTS}}", "{{ARGUMENTS}}"),
    ("\\\\{{ARGUMENTS}}", "\\a b c d"),
    ("a  {{~ARGUMENTS~}}  b", "aa b c db"),
    ("x {{~! gone ~}}\n\n y", "xy"),
])
def test_handlebars(source: str, result: str) -> None:
    assert render_handlebars(source, CONTEXT) == result


def test_if_treats_empty_lists_and_zero_as_false() -> None:
    assert render_handlebars("{{#if args}}y{{else}}n{{/if}}", EMPTY) == "n"
    assert render_handlebars("{{#if args.length}}y{{else}}n{{/if}}", EMPTY) == "n"
    assert render_handlebars("{{#if ARGUMENTS}}y{{else}}n{{/if}}", EMPTY) == "n"


def test_block_tags_alone_on_a_line_take_the_line() -> None:
    source = "Files:\n{{#each args}}\n  - {{this}}\n{{/each}}\nEnd\n"
    assert render_handlebars(source, CONTEXT) == "Files:\n  - a\n  - b c\n  - d\nEnd\n"
    source = "{{#if nothing}}\nyes\n  {{else}}  \nno\n{{/if}}\n{{! note }}\nafter"
    assert render_handlebars(source, CONTEXT) == "no\nafter"
    # A variable alone on its line keeps the line; two tags on one line are not alone.
    assert render_handlebars("a\n{{nothing}}\nb", CONTEXT) == "a\n\nb"
    assert render_handlebars("a\n{{#if args}}{{#if args}}\nb\n{{/if}}{{/if}}\n", CONTEXT) == (
        "a\n\nb\n\n")


@pytest.mark.parametrize(("source", "message"), [
    ("a\n{{#if args}}b", r"line 2: \{\{#if\}\} is never closed"),
    ("{{#if args}}{{/each}}", r"line 1: \{\{/each\}\} does not close \{\{#if\}\} \(line 1\)"),
    ("x\n\n{{/if}}", r"line 3: \{\{/if\}\} closes nothing"),
    ("{{else}}", r"line 1: \{\{else\}\} outside a block"),
    ("{{#if args}}{{else}}{{else}}{{/if}}", r"a second \{\{else\}\}"),
    ("{{#if}}{{/if}}", r"#if takes exactly one argument"),
    ("{{#if a b}}{{/if}}", r"#if takes exactly one argument"),
    ("{{#each args as |x|}}{{/each}}", r"block parameters are not supported"),
    ("{{#custom x}}{{/custom}}", r"unknown block helper #custom"),
    ("{{shout ARGUMENTS}}", r"line 1: unknown helper 'shout'"),
    ("{{> partial}}", r"partials are not supported"),
    ("{{#> layout}}{{/layout}}", r"partials are not supported"),
    ("{{join (arg 1) x}}", r"sub-expressions are not supported"),
    ("one\ntwo {{ARGUMENTS", r"line 2: '\{\{' is never closed"),
    ("{{}}", r"an empty tag"),
    ("{{arg x=}}", r"x= has no value"),
])
def test_handlebars_errors(source: str, message: str) -> None:
    with pytest.raises(TemplateError, match=message):
        render_handlebars(source, CONTEXT)


# --- the prompt formatter -------------------------------------------------------------------


@pytest.mark.parametrize(("text", "result"), [
    ("plain", "plain"),
    ("trailing   \nspaces\t", "trailing\nspaces"),
    ("a\n\nb", "a\n\nb"),  # one blank line stays
    ("a\n\n\nb", "a\nb"),  # a run of two or more goes entirely
    ("a\n  \n \t\nb", "a\nb"),  # whitespace-only lines are blank
    ("\n\n\na\n\n", "a"),  # leading and trailing blank lines go
    ("\na", "a"),
    ("a\n\n</tag>", "a\n</tag>"),  # no blank line before a closing tag
    ("<tag>\n\nbody\n\n</tag>", "<tag>\n\nbody\n</tag>"),
    ("| a |  b  |\n| --- |:---:|\n|  1 | 2 |", "|a|b|\n|---|:---:|\n|1|2|"),
    ("  | a | b |", "  |a|b|"),  # indentation stays
    ("|:--|--:|", "|:---|---:|"),
    ("not | a | row", "not | a | row"),
    # Inside a fence only trailing whitespace is cut.
    ("```\ncode  \n\n\n| a |\n```\nafter", "```\ncode\n\n\n| a |\n```\nafter"),
    ("~~~py\nx\n\n\ny\n~~~", "~~~py\nx\n\n\ny\n~~~"),
])
def test_format_prompt(text: str, result: str) -> None:
    assert format_prompt(text) == result


_LINES = st.lists(st.sampled_from(["", " ", "\t", "a", "  b  ", "```", "~~~", "| a |  b |",
                                   "|---|", "<x>", "</x>", "\u3000", "c\u3000"]), max_size=12)


@settings(max_examples=300)
@given(_LINES)
def test_format_prompt_is_idempotent(lines: list[str]) -> None:
    once = format_prompt("\n".join(lines))
    assert format_prompt(once) == once
