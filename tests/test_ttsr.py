"""TTSR rules as a host sees them (issue 23; docs/guides/approval.md#rules-ttsr): the real
``omp --mode rpc`` against the fake LLM server, every frame read raw; what the model is sent comes
from the fake's recorded requests."""

from __future__ import annotations

import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest
import trio
from agent_helpers import fake_provider, text_reply, tool_call, tools_reply, write_models_yml
from extension_helpers import FAKE_ARGS, Frame, RawHost, of_type, open_process_host

from omp.session.rules import reach
from omp.testing.fake_llm import FakeLLM, open_fake_llm

LIMIT = 90
TRUSTED = [*FAKE_ARGS, "--trust-project"]
RULE = """---
description: never say the F word
condition: "FORBIDDEN"
---
Do not write FORBIDDEN. Use ALLOWED instead.
"""
INJECTION = ('<system-interrupt reason="rule_violation" rule="no-forbidden" '
             'path=".omp/rules/no-forbidden.md">\n'
             "Output interrupted: violated user-defined rule.\n"
             "Not prompt injection; coding agent enforcing project rules.\n"
             "MUST comply:\n\n"
             "Do not write FORBIDDEN. Use ALLOWED instead.\n"
             "</system-interrupt>")
STREAMED = text_reply("Hello ", 0.2, "there FORB", 0.2, "IDDEN word", 0.5, " and more", 0.5,
                      " never seen")


@pytest.fixture
def cwd(tmp_path: Path) -> Path:
    path = tmp_path / "project"
    path.mkdir()
    return path


def shown(path: Path) -> str:
    """A rule path as the texts show it outside the cwd: under the home directory ``~/…``
    (where a TMPDIR may lie), else absolute."""
    return f"~/{path.relative_to(Path.home())}" if path.is_relative_to(Path.home()) \
        else str(path)


def write_rule(directory: Path, name: str = "no-forbidden", text: str = RULE) -> Path:
    directory.mkdir(parents=True, exist_ok=True)
    path = directory / f"{name}.md"
    path.write_text(text)
    return path


def requests_text(fake: FakeLLM, index: int) -> list[tuple[str, str]]:
    return [(m["role"], str(m["content"])) for m in fake.requests[index].json()["messages"]]


async def prompt(host: RawHost, request_id: str = "p", message: str = "say hi") -> list[Frame]:
    await host.send({"id": request_id, "type": "prompt", "message": message})
    return await host.until_type("prompt_result", id=request_id)


async def test_a_rule_cuts_the_stream_and_the_turn_runs_again(cwd: Path,
                                                              isolated_agent_dir: Path) -> None:
    path = write_rule(cwd / ".omp" / "rules")
    script = [STREAMED, text_reply("Clean answer"), text_reply("Again FORBIDDEN, unchecked")]
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir) as fake, \
                open_process_host(cwd, args=[*FAKE_ARGS, "--trust-project"]) as host:
            frames = await prompt(host)
            await fake.wait_for_disconnect()  # the cut stream's connection was dropped
            await host.send({"id": "m", "type": "get_messages"})
            (messages,) = of_type(await host.until_type("response", id="m"), "response")
            # Once per session: the same word later goes through.
            again = await prompt(host, "p2", "once more")
    (triggered,) = of_type(frames, "ttsr_triggered")
    at = frames.index(triggered)
    assert frames[at - 1]["assistantMessageEvent"]["delta"] == "IDDEN word"
    assert triggered["rules"] == [{
        "name": "no-forbidden", "path": str(path),
        "content": "Do not write FORBIDDEN. Use ALLOWED instead.", "alwaysApply": False,
        "description": "never say the F word", "condition": ["FORBIDDEN"],
        "_source": {"provider": "native", "providerName": "OMP", "path": str(path),
                    "level": "project"}}]
    cut = frames[at + 1]
    assert cut["type"] == "message_end"
    assert cut["message"]["stopReason"] == "aborted"
    assert cut["message"]["errorMessage"] == "TTSR matched rule: no-forbidden"
    assert cut["message"]["content"] == [{"type": "text", "text": "Hello there FORBIDDEN word"}]
    kinds = [f["type"] for f in frames[at + 1:]]
    assert kinds[:4] == ["message_end", "turn_end", "agent_start", "turn_start"]
    assert kinds.count("agent_end") == 1
    # No text after the matching delta reached the host.
    assert all("more" not in str(f) for f in frames if f["type"] == "message_update")
    (end,) = of_type(frames, "agent_end")
    assert [m["content"] for m in end["messages"]] == [[{"type": "text",
                                                         "text": "Clean answer"}]]
    assert frames[-1]["status"] == "completed"
    # The retried request: the cut message discarded, the rule as a user message.
    assert requests_text(fake, 1)[1:] == [("user", "say hi"), ("user", INJECTION)]
    listed = messages["data"]["messages"]
    assert [(m["role"], m.get("customType")) for m in listed] == [
        ("user", None), ("custom", "ttsr-injection"), ("assistant", None)]
    assert listed[1]["display"] is False
    assert listed[1]["details"] == {"rules": ["no-forbidden"]}
    assert not of_type(again, "ttsr_triggered")
    assert len(fake.requests) == 3


async def test_an_untrusted_projects_rules_are_not_loaded(cwd: Path,
                                                          isolated_agent_dir: Path) -> None:
    write_rule(cwd / ".omp" / "rules")
    with trio.fail_after(LIMIT):
        async with fake_provider([STREAMED], isolated_agent_dir) as fake, \
                open_process_host(cwd, args=FAKE_ARGS) as host:
            frames = await prompt(host)
    assert not of_type(frames, "ttsr_triggered")
    (notice,) = [f for f in host.startup if f["type"] == "notice"]
    assert notice["message"].startswith(f"Project rules in {cwd / '.omp' / 'rules'} were not "
                                        "loaded: the project is not trusted")
    end = of_type(frames, "message_end")[-1]
    assert end["message"]["stopReason"] == "stop"
    assert len(fake.requests) == 1


async def test_a_rule_that_does_not_interrupt(cwd: Path, isolated_agent_dir: Path) -> None:
    # A user rule (no trust needed), interruptMode never: reported, the stream goes on, and
    # the rule reaches the model once the answer is complete.
    write_rule(isolated_agent_dir / "rules", "quiet", "---\ncondition: FORB\n"
               "interruptMode: never\nscope: text\n---\nBe polite.\n")
    with trio.fail_after(LIMIT):
        async with fake_provider([STREAMED, text_reply("Sorry.")], isolated_agent_dir) as fake, \
                open_process_host(cwd, args=FAKE_ARGS) as host:
            frames = await prompt(host)
    (triggered,) = of_type(frames, "ttsr_triggered")
    assert triggered["rules"][0]["interruptMode"] == "never"
    assert triggered["rules"][0]["scope"] == ["text"]
    assert triggered["rules"][0]["_source"]["level"] == "user"
    first = of_type(frames, "message_end")[1]["message"]
    assert first["stopReason"] == "stop"
    assert first["content"][0]["text"] == "Hello there FORBIDDEN word and more never seen"
    assert len(fake.requests) == 2
    assert requests_text(fake, 1)[-1][1].endswith("Be polite.\n</system-interrupt>")
    # Queued as a follow-up, as in the original: the same attempt goes on (one agent_start),
    # and the hidden message is taken in like any follow-up, with its message frames.
    assert len(of_type(frames, "agent_start")) == 1
    assert len(of_type(frames, "agent_end")) == 1
    custom = [f for f in of_type(frames, "message_end") if f["message"]["role"] == "custom"]
    ((injected,),) = [[f["message"] for f in custom]]
    assert (injected["customType"], injected["display"], injected["details"]) == (
        "ttsr-injection", False, {"rules": ["quiet"]})
    assert frames.index(custom[0]) > frames.index(of_type(frames, "message_end")[1])


async def test_abort_during_the_retried_turn(cwd: Path, isolated_agent_dir: Path) -> None:
    write_rule(cwd / ".omp" / "rules")
    script = [STREAMED, text_reply("Slow", 30.0, " clean")]
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir) as fake, \
                open_process_host(cwd, args=[*FAKE_ARGS, "--trust-project"]) as host:
            await host.send({"id": "p", "type": "prompt", "message": "say hi"})
            await host.until_type("ttsr_triggered")
            await host.until(lambda f: f["type"] == "message_update"
                             and f["assistantMessageEvent"].get("delta") == "Slow")
            await host.send({"id": "a", "type": "abort"})
            await host.until_type("prompt_result", id="p")
    frames = host.frames
    assert len(of_type(frames, "agent_end")) == 1
    assert of_type(frames, "prompt_result")[0]["status"] == "aborted"
    last = of_type(frames, "message_end")[-1]["message"]
    assert (last["stopReason"], last["errorMessage"]) == ("aborted", "Interrupted by user")
    assert len(fake.requests) == 2


async def test_no_rules_flag_and_disabled_rules(cwd: Path, isolated_agent_dir: Path,
                                                tmp_path: Path) -> None:
    write_rule(isolated_agent_dir / "rules")
    overlay = tmp_path / "off.yml"
    overlay.write_text("ttsr:\n  disabledRules: [no-forbidden]\n")
    for extra in (["--no-rules"], ["--config", str(overlay)]):
        with trio.fail_after(LIMIT):
            async with fake_provider([STREAMED], isolated_agent_dir) as fake, \
                    open_process_host(cwd, args=[*FAKE_ARGS, *extra]) as host:
                frames = await prompt(host)
        assert not of_type(frames, "ttsr_triggered"), extra
        assert len(fake.requests) == 1, extra


async def test_a_tool_argument_rule_that_does_not_interrupt(cwd: Path,
                                                            isolated_agent_dir: Path) -> None:
    # docs/guides/approval.md#what-a-host-sees-of-a-rule: reported while the arguments stream, the
    # call runs, and its result starts with the rule's reminder.
    write_rule(isolated_agent_dir / "rules", "no-secret", "---\ncondition: secret\n"
               "scope: \"tool:bash\"\ninterruptMode: never\n---\nNever echo secrets.\n")
    script = [tools_reply(tool_call("c1", "bash", {"command": "echo secret"})),
              text_reply("Noted.")]
    frames, fake = await prompt_once(cwd, isolated_agent_dir, script, FAKE_ARGS)
    (triggered,) = of_type(frames, "ttsr_triggered")
    at = frames.index(triggered)
    assert frames[at - 1]["assistantMessageEvent"]["type"] == "toolcall_delta"
    (end,) = of_type(frames, "tool_execution_end")
    reminder = ('<system-reminder reason="rule_violation" rule="no-secret" '
                f'path="{shown(isolated_agent_dir / "rules" / "no-secret.md")}">\n'
                "User-defined rule matched tool-call arguments. Rule configured not to "
                "interrupt → tool ran. MUST comply with the following instruction on subsequent "
                "tool calls and responses. NOT prompt injection — coding agent enforcing project "
                "rules.\n\nNever echo secrets.\n</system-reminder>")
    assert [b["text"] for b in end["result"]["content"]] == [reminder, "secret\n"]
    assert end["isError"] is False
    assert len(fake.requests) == 2
    (result,) = [m for m in fake.requests[1].json()["messages"] if m["role"] == "tool"]
    assert str(result["content"]).startswith(reminder)


async def test_rules_in_a_subagents_session(cwd: Path, isolated_agent_dir: Path) -> None:
    # A rule for the `task` agent only (`agents`): it cuts the child's stream and the child's
    # turn runs again with the rule; the main session, which says the word too, is not watched
    # by it. A rule for `main` only does not watch the child.
    write_rule(cwd / ".omp" / "rules", text=RULE.replace("---\nDo", "agents: [task]\n---\nDo"))
    write_rule(cwd / ".omp" / "rules", "main-only",
               "---\ncondition: Hello\nagents: main\n---\nNo greetings.\n")
    write_rule(cwd / ".omp" / "rules", "kids",
               "---\nalwaysApply: true\nagents: [task]\n---\nONLY-FOR-TASK.\n")
    (isolated_agent_dir / "config.yml").write_text("async:\n  enabled: false\n")
    child = {"bodyContains": "Complete assignment thoroughly:\\n\\nAlpha"}
    script = [
        {"match": child, **STREAMED},
        {"match": child, **tools_reply(tool_call("y1", "yield", {"data": {"ok": True}}))},
        {"match": {"bodyContains": "task-result"}, **text_reply("All FORBIDDEN done")},
        tools_reply(tool_call("t1", "task", {"context": "Goal", "tasks": [
            {"name": "Kid", "task": "Alpha: say hello"}]})),
    ]
    frames, fake = await prompt_once(cwd, isolated_agent_dir, script, TRUSTED)
    assert frames[-1]["status"] == "completed"
    assert not of_type(frames, "ttsr_triggered")  # the main session's own frames
    assert len(fake.requests) == 4
    child_requests = [i for i, r in enumerate(fake.requests)
                      if b"Complete assignment thoroughly:\\n\\nAlpha" in r.body]
    assert len(child_requests) == 2
    retried = requests_text(fake, child_requests[1])
    assert retried[-1] == ("user", INJECTION)
    assert b"No greetings." not in fake.requests[child_requests[1]].body
    # The always-apply rule for `task`: in the child's system prompt, not in the parent's.
    assert "ONLY-FOR-TASK." in system_prompt(fake, child_requests[0])
    assert "ONLY-FOR-TASK" not in system_prompt(fake, 0)
    final = of_type(frames, "message_end")[-1]["message"]
    assert final["content"][0]["text"] == "All FORBIDDEN done"


async def prompt_once(cwd: Path, agent_dir: Path, script: list[Any],
                      args: Sequence[str]) -> tuple[list[Frame], FakeLLM]:
    """One prompt through the real process with the fake LLM serving ``script``: its frames
    up to its ``prompt_result``, and the fake (its requests)."""
    with trio.fail_after(LIMIT):
        async with open_fake_llm(script) as fake:
            write_models_yml(agent_dir, fake.base_url)
            async with open_process_host(cwd, args=list(args)) as host:
                return await prompt(host), fake


def system_prompt(fake: FakeLLM, index: int) -> str:
    (role, text), *_ = requests_text(fake, index)
    assert role == "system"
    return text


async def test_always_apply_rules_join_the_system_prompt(cwd: Path, isolated_agent_dir: Path,
                                                         tmp_path: Path) -> None:
    # RULES.md (user and project, whatever their frontmatter), `alwaysApply: true` rules from
    # the native folder and the other tools' folders; `agents` and `ttsr.disabledRules` choose.
    (isolated_agent_dir / "RULES.md").write_text("USER-RULES-MD body.\n")
    (cwd / ".omp").mkdir()
    (cwd / ".omp" / "RULES.md").write_text("---\nalwaysApply: false\n---\nPROJECT-RULES-MD.\n")
    write_rule(cwd / ".omp" / "rules", "always", "---\nalwaysApply: true\n---\nALWAYS-NATIVE.\n")
    write_rule(cwd / ".omp" / "rules", "kids", "---\nalwaysApply: true\nagents: [task]\n---\n"
               "ONLY-FOR-TASK.\n")
    write_rule(cwd / ".omp" / "rules", "book", "---\ndescription: a rulebook rule\n---\n"
               "RULEBOOK-ONLY.\n")
    write_rule(cwd / ".omp" / "rules", "turned-off", "---\nalwaysApply: true\n---\nTURNED-OFF.\n")
    cursor = cwd / ".cursor" / "rules"
    cursor.mkdir(parents=True)
    (cursor / "style.mdc").write_text("---\ndescription: x\nalwaysApply: true\n---\nCURSOR-MDC.\n")
    write_rule(cwd / ".windsurf" / "rules", "wind", "---\nalwaysApply: true\n---\nWINDSURF.\n")
    (cwd / ".clinerules").write_text("---\nalwaysApply: true\n---\nCLINE-FILE.\n")
    overlay = tmp_path / "off.yml"
    overlay.write_text("ttsr:\n  disabledRules: [turned-off]\n")
    script = [text_reply("one"), text_reply("two")]
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir) as fake:
            async with open_process_host(cwd, args=[*FAKE_ARGS, "--trust-project",
                                                    "--config", str(overlay)]) as host:
                await prompt(host)
            async with open_process_host(cwd, args=FAKE_ARGS) as host:
                await prompt(host, "p2")
    trusted, untrusted = system_prompt(fake, 0), system_prompt(fake, 1)
    assert ("ALWAYS-NATIVE.\nPROJECT-RULES-MD.\nUSER-RULES-MD body.\nCURSOR-MDC.\nWINDSURF.\n"
            "CLINE-FILE.\n\nCurrent date: ") in trusted
    for absent in ("ONLY-FOR-TASK", "RULEBOOK-ONLY", "TURNED-OFF", "alwaysApply"):
        assert absent not in trusted
    # Untrusted: only the user's RULES.md; the notice names every project place left out.
    assert "USER-RULES-MD body." in untrusted
    for absent in ("PROJECT-RULES-MD", "ALWAYS-NATIVE", "CURSOR-MDC", "WINDSURF", "CLINE"):
        assert absent not in untrusted
    (notice,) = [f for f in host.startup if f["type"] == "notice"]
    for place in (cwd / ".omp" / "rules", cwd / ".omp" / "RULES.md", cwd / ".cursor" / "rules",
                  cwd / ".windsurf" / "rules", cwd / ".clinerules"):
        assert str(place) in notice["message"]


async def test_other_tools_rules_and_an_ast_condition(cwd: Path,
                                                      isolated_agent_dir: Path) -> None:
    # A Cursor rule with a condition is a TTSR rule like a native one (its source named); a
    # rule with an astCondition is refused with a notice naming its file (even with a regex
    # condition beside it: half a rule would watch what its author did not mean).
    cursor = cwd / ".cursor" / "rules"
    cursor.mkdir(parents=True)
    (cursor / "no-forbidden.mdc").write_text(RULE)
    ast_rule = write_rule(cwd / ".omp" / "rules", "ast", "---\ncondition: Hello\n"
                          "astCondition: console.log($$$)\n---\nNo logging.\n")
    script = [STREAMED, text_reply("Clean answer")]
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir) as fake, \
                open_process_host(cwd, args=[*FAKE_ARGS, "--trust-project"]) as host:
            frames = await prompt(host)
    (notice,) = [f for f in host.startup if f["type"] == "notice"]
    assert notice["message"] == (
        f"Rule {ast_rule} was not loaded: it has an astCondition (ast-grep patterns), which "
        "this runtime cannot check; use a regex condition instead")
    (triggered,) = of_type(frames, "ttsr_triggered")
    (rule,) = triggered["rules"]
    assert rule["name"] == "no-forbidden"
    assert rule["_source"] == {"provider": "cursor", "providerName": "Cursor",
                               "path": str(cursor / "no-forbidden.mdc"), "level": "project"}
    assert requests_text(fake, 1)[-1] == ("user", INJECTION.replace(
        ".omp/rules/no-forbidden.md", ".cursor/rules/no-forbidden.mdc"))
    assert b"No logging." not in fake.requests[1].body


async def test_a_quiet_match_in_an_aborted_message_is_dropped(cwd: Path,
                                                              isolated_agent_dir: Path) -> None:
    # docs/guides/approval.md#what-a-host-sees-of-a-rule: a non-interrupting match is delivered only
    # when its message ends normally; aborted, it is dropped (nothing queued, nothing in the
    # history).
    write_rule(isolated_agent_dir / "rules", "quiet", "---\ncondition: FORB\n"
               "interruptMode: never\nscope: text\n---\nBe polite.\n")
    script = [text_reply("Hello ", 0.2, "there FORB", 0.2, "IDDEN", 30.0, " never seen"),
              text_reply("Next answer")]
    with trio.fail_after(LIMIT):
        async with fake_provider(script, isolated_agent_dir) as fake, \
                open_process_host(cwd, args=FAKE_ARGS) as host:
            await host.send({"id": "p", "type": "prompt", "message": "say hi"})
            await host.until_type("ttsr_triggered")
            await host.send({"id": "a", "type": "abort"})
            aborted = await host.until_type("prompt_result", id="p")
            after = await prompt(host, "p2", "again")
    assert aborted[-1]["status"] == "aborted"
    assert after[-1]["status"] == "completed"
    assert len(fake.requests) == 2
    assert all(role != "user" or "Be polite" not in text
               for role, text in requests_text(fake, 1))
    assert not [f for f in host.frames if f["type"] == "message_end"
                and f["message"]["role"] == "custom"]


@pytest.mark.parametrize(("pattern", "expected"), [
    ("FORBIDDEN", 9), ("(?i)console\\.log", 11), ("a{1,5}b", 6), ("(?<=x)foo(?=abc)", 7),
    ("x(?!y{1,3})", 4), ("foo.*bar", None), ("(a|bcd)+", None), ("x(?=a+)", None)])
def test_how_far_back_a_condition_is_searched(pattern: str, expected: int | None) -> None:
    assert reach(re.compile(pattern)) == expected


async def test_a_match_may_span_many_deltas(cwd: Path, isolated_agent_dir: Path) -> None:
    # As in the original, the whole text so far is searched: a match thousands of characters
    # long, spread over deltas, is seen at the delta that completes it — for a condition with
    # no bound (searched whole) and for a long bounded one (searched from where it can start).
    write_rule(isolated_agent_dir / "rules", "unbounded", "---\ncondition: 'BEGIN x+ END'\n"
               "interruptMode: never\nscope: text\n---\nNo long x runs.\n")
    write_rule(isolated_agent_dir / "rules", "bounded", "---\ncondition: 'START[a-z ]{2500}STOP'"
               "\ninterruptMode: never\nscope: text\n---\nNo long a runs.\n")
    stream = text_reply("BEGIN ", "x" * 1500, "x" * 1500, " END. START", "a" * 1250, "a" * 1250,
                        "STOP", " done")
    with trio.fail_after(LIMIT):
        async with fake_provider([stream, text_reply("Understood.")], isolated_agent_dir) as fake, \
                open_process_host(cwd, args=FAKE_ARGS) as host:
            frames = await prompt(host)
    triggered = of_type(frames, "ttsr_triggered")
    assert [[r["name"] for r in t["rules"]] for t in triggered] == [["unbounded"], ["bounded"]]
    assert [frames[frames.index(t) - 1]["assistantMessageEvent"]["delta"]
            for t in triggered] == [" END. START", "STOP"]
    assert len(fake.requests) == 2


async def test_rulebook_rules_are_listed_and_read_on_demand(cwd: Path,
                                                           isolated_agent_dir: Path) -> None:
    # A rule with only a description is a rulebook rule: its name and description are in the
    # system prompt (not its body), `read rule://<name>` gives the model the body; an unknown
    # name is an error naming the rules there are; `agents` chooses the sessions it is for.
    write_rule(cwd / ".omp" / "rules", "book", "---\ndescription: How we name\n  branches\n"
               "---\nBRANCH-RULE-BODY: use feature/<ticket>.\n")
    write_rule(isolated_agent_dir / "rules", "commits", "---\ndescription: Commit messages\n"
               "---\nCOMMIT-BODY.\n")
    write_rule(cwd / ".omp" / "rules", "kid-book", "---\ndescription: For subagents\n"
               "agents: [task]\n---\nKID-BODY.\n")
    script = [tools_reply(tool_call("r1", "read", {"path": "rule://book"}),
                          tool_call("r2", "read", {"path": "rule://nope"}),
                          tool_call("r3", "read", {"path": "rule://kid-book"})),
              text_reply("done")]
    frames, fake = await prompt_once(cwd, isolated_agent_dir, script, TRUSTED)
    prompt_text = system_prompt(fake, 0)
    assert ("# Skills & Rules\nRule that applies to the task → MUST read `rule://<name>` first "
            "and follow it.\n<rules>\n- book: How we name branches\n- commits: Commit messages\n"
            "</rules>") in prompt_text
    for absent in ("BRANCH-RULE-BODY", "COMMIT-BODY", "kid-book", "KID-BODY"):
        assert absent not in prompt_text
    ends = {f["toolCallId"]: f for f in of_type(frames, "tool_execution_end")}
    assert ends["r1"]["isError"] is False
    assert ends["r1"]["result"]["content"][0]["text"] == (
        "BRANCH-RULE-BODY: use feature/<ticket>.")
    for missing in ("r2", "r3"):
        assert ends[missing]["isError"] is True
    assert ends["r2"]["result"]["content"][0]["text"] == (
        "Cannot read rule://nope: no rule named 'nope' (rules to read: book, commits)")
    assert not of_type(frames, "ttsr_triggered")


async def test_a_rulebook_rule_for_a_subagent(cwd: Path, isolated_agent_dir: Path) -> None:
    # A rulebook rule for the `task` agent only: listed in the child's prompt, read by the
    # child's `read`; the parent's prompt does not list it.
    write_rule(cwd / ".omp" / "rules", "kid-book", "---\ndescription: For subagents\n"
               "agents: [task]\n---\nKID-BODY.\n")
    (isolated_agent_dir / "config.yml").write_text("async:\n  enabled: false\n")
    child = {"bodyContains": "Complete assignment thoroughly:\\n\\nAlpha"}
    script = [
        {"match": {"bodyContains": "KID-BODY"},
         **tools_reply(tool_call("y1", "yield", {"data": {"ok": True}}))},
        {"match": child, **tools_reply(tool_call("k1", "read", {"path": "rule://kid-book"}))},
        {"match": {"bodyContains": "task-result"}, **text_reply("All done")},
        tools_reply(tool_call("t1", "task", {"context": "Goal", "tasks": [
            {"name": "Kid", "task": "Alpha: read the rule"}]})),
    ]
    frames, fake = await prompt_once(cwd, isolated_agent_dir, script, TRUSTED)
    assert frames[-1]["status"] == "completed"
    assert len(fake.requests) == 4
    assert "rule://" not in system_prompt(fake, 0)
    child_requests = [i for i, r in enumerate(fake.requests)
                      if b"Complete assignment thoroughly:\\n\\nAlpha" in r.body]
    assert len(child_requests) == 2
    assert "- kid-book: For subagents" in system_prompt(fake, child_requests[0])
    assert requests_text(fake, child_requests[1])[-1][1].endswith("KID-BODY.")


async def test_claude_plugin_package_and_opted_in_user_rules(cwd: Path, isolated_agent_dir: Path,
                                                             tmp_path: Path) -> None:
    # Claude's project rules folder, the `rules/` of an extension package (`-e <dir>`) and of
    # a plugin (`--plugin-dir`), and, only for the providers `enabledProviders` names, the
    # other tools' user-level rules; first of a name wins (the package's over Claude's);
    # `disabledProviders` leaves a provider out; an untrusted project's Claude rules are
    # named in the one notice.
    home, package, plugin = tmp_path / "home", tmp_path / "pkg", tmp_path / "plug"
    always = "---\nalwaysApply: true\n---\n{}\n"
    write_rule(package / "rules", "pkg", always.format("PKG-RULE."))
    write_rule(package / "rules", "same-name", always.format("PKG-SHARED."))
    write_rule(cwd / ".claude" / "rules", "same-name", always.format("CLAUDE-SHARED."))
    write_rule(cwd / ".claude" / "rules", "cl", always.format("CLAUDE-PROJECT."))
    write_rule(home / ".claude" / "rules", "clu", always.format("CLAUDE-USER."))
    write_rule(plugin / "rules", "plug", always.format("PLUGIN-RULE."))
    cursor = home / ".cursor" / "rules"
    cursor.mkdir(parents=True)
    (cursor / "cu.mdc").write_text(always.format("CURSOR-USER."))
    write_rule(home / ".codeium" / "windsurf" / "memories", "global_rules",
               always.format("WINDSURF-GLOBAL."))
    args = [*FAKE_ARGS, "-e", str(package), "--plugin-dir", str(plugin)]
    env = {"HOME": str(home), "CLAUDE_CONFIG_DIR": None}
    config = isolated_agent_dir / "config.yml"
    with trio.fail_after(LIMIT):
        async with fake_provider([text_reply("1"), text_reply("2"), text_reply("3")],
                                 isolated_agent_dir) as fake:
            async with open_process_host(cwd, args=[*args, "--trust-project"], env=env) as host:
                await prompt(host)
            config.write_text("enabledProviders: [claude, cursor, windsurf]\n")
            async with open_process_host(cwd, args=[*args, "--trust-project"], env=env) as host:
                await prompt(host, "p2")
            config.write_text("enabledProviders: ['*']\ndisabledProviders: [cursor]\n")
            async with open_process_host(cwd, args=args, env=env) as untrusted:
                await prompt(untrusted, "p3")
    plain, opted, third = (system_prompt(fake, i) for i in range(3))
    assert "PKG-RULE.\nPKG-SHARED.\nCLAUDE-PROJECT.\nPLUGIN-RULE.\n\nCurrent date" in plain
    for absent in ("CLAUDE-SHARED", "CLAUDE-USER", "CURSOR-USER", "WINDSURF-GLOBAL"):
        assert absent not in plain
    assert ("PKG-RULE.\nPKG-SHARED.\nCLAUDE-PROJECT.\nCLAUDE-USER.\nPLUGIN-RULE.\nCURSOR-USER.\n"
            "WINDSURF-GLOBAL.\n\nCurrent date") in opted
    assert "PKG-RULE.\nPKG-SHARED.\nCLAUDE-USER.\nPLUGIN-RULE.\nWINDSURF-GLOBAL.\n\n" in third
    (notice,) = [f for f in untrusted.startup if f["type"] == "notice"]
    assert notice["message"].startswith(f"Project rules in {cwd / '.claude' / 'rules'} were not "
                                        "loaded: the project is not trusted")


def test_rulebook_listing_joins_the_skills_section(tmp_path: Path) -> None:
    # With skills, the rulebook lines follow them under the one "Skills & Rules" heading;
    # without the read tool, neither is listed.
    from omp.commands.skills import Skill
    from omp.session.system_prompt import build_system_prompt
    from omp.tools import default_tools
    from omp.tools.base import RulebookRule, ToolContext

    tools = default_tools(ToolContext(tmp_path))
    skill = Skill("pdf", "PDF tools", tmp_path / "SKILL.md", "custom")
    rule = RulebookRule("branches", "How we name branches", "BODY", tmp_path / "b.md")
    _, block = build_system_prompt(tools=tools, cwd=tmp_path, agent_directory=tmp_path,
                                   skills=[skill], rulebook=[rule], context=[])
    assert ("# Skills & Rules\nMatching skill → MUST read `skill://<name>` first.\n<skills>\n"
            "- pdf: PDF tools\n</skills>\nRule that applies to the task → MUST read "
            "`rule://<name>` first and follow it.\n<rules>\n- branches: How we name branches\n"
            "</rules>") in block
    assert block.count("# Skills & Rules") == 1
    _, bare = build_system_prompt(tools=[t for t in tools if t.name != "read"], cwd=tmp_path,
                                  agent_directory=tmp_path, skills=[skill], rulebook=[rule],
                                  context=[])
    assert "rule://" not in bare
    assert "Skills & Rules" not in bare
