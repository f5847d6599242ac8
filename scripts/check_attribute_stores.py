"""Find every assignment to another object's attribute in ``omp/``: ``x.attr = ...``,
``x.attr += ...`` and ``x.attr: T = ...`` where ``x`` is not ``self`` or ``cls`` (``self.a.b``
counts: its object is ``self.a``, not ``self``).

An object is complete when it is constructed: its collaborators come in through the constructor
(or a classmethod that passes them in), and a value that changes over its life changes through a
method of its own class that says what happens (``set_...``, ``use_...``). A store from outside
wires an object after the fact, and nothing tells the reader which fields are still to be
filled. Allowed without listing:

* trio cancel-scope fields, ``deadline`` and ``shield``: moving a deadline is trio's API;
* exception attributes, ``__cause__``, ``__context__``, ``__notes__``, ``__traceback__``;
* a store on a local variable that the same function created by calling a constructor (a
  capitalised name, ``Foo(...)`` or ``Foo.make(...)``, or ``cls(...)`` in a classmethod): a
  record being filled before it is handed on.

Everything else is listed in ``ALLOWED`` below with a one-line reason. The list is a ratchet: a
new store not on it fails, and so does an entry whose store is gone, so the list only shrinks.

``python scripts/check_attribute_stores.py`` prints each failure and exits 1 if there is one;
nox's ``lint`` session runs it, and ``tests/test_attribute_stores.py`` runs the check too.
"""

from __future__ import annotations

import ast
import sys
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGE = ROOT / "omp"

CANCEL_SCOPE_FIELDS = frozenset({"deadline", "shield"})
EXCEPTION_FIELDS = frozenset({"__cause__", "__context__", "__notes__", "__traceback__"})
OWN = frozenset({"self", "cls"})

# Reasons shared by several entries.
RECORD = "a mutable record its owner fills as the stream or state machine goes"
STATE = "a state record shared by the tasks of one machine; the module owns its rules"
ARGS = "argparse's namespace, normalised before use"
TEST_KIT = "test kit: the fixture fills its own helper object"
TAGGED = "an error tagged with its origin where it crosses the mapping boundary"
NESTED = "a plain record nested in its owner, changed by the owner's own method"

ALLOWED: dict[tuple[str, str], str] = {
    ("omp/acp/session.py", "pending.result"): STATE,
    ("omp/acp/session.py", "pending.cancelled"): STATE,
    ("omp/agent/loop.py", "turn.assistant"): RECORD,
    ("omp/agent/loop.py", "turn.call"): RECORD,
    ("omp/agent/loop.py", "turn.message_started"): RECORD,
    ("omp/agent/loop.py", "turn.opened"): RECORD,
    ("omp/agent/loop.py", "turn.taking_in"): RECORD,
    ("omp/cli.py", "args.resume"): ARGS,
    ("omp/cli.py", "args.continue_"): ARGS,
    ("omp/client.py", "pending.response"): RECORD,
    ("omp/commands/render.py", "block.inverse"): RECORD,
    ("omp/extensions/runtime.py", "watch.step_start"): RECORD,
    ("omp/llm/builder.py", "block.signature"): RECORD,
    ("omp/llm/builder.py", "block.thought_signature"): RECORD,
    ("omp/llm/builder.py", "block.tool_name"): RECORD,
    ("omp/llm/builder.py", "block.tool_id"): RECORD,
    ("omp/llm/builder.py", "block.final"): RECORD,
    ("omp/llm/builder.py", "block.closed"): RECORD,
    ("omp/llm/errors.py", "exc.model"): TAGGED,
    ("omp/llm/errors.py", "exc.provider"): TAGGED,
    ("omp/login/flows.py", "loopback.done"): STATE,
    ("omp/lsp/client.py", "opened.sent_at"): RECORD,
    ("omp/lsp/client.py", "opened.text"): RECORD,
    ("omp/lsp/client.py", "opened.version"): RECORD,
    ("omp/pipe.py", "pipe.buffer"): STATE,
    ("omp/pipe.py", "pipe.send_closed"): STATE,
    ("omp/pipe.py", "pipe.receive_closed"): STATE,
    ("omp/process.py", "orphanage.term_at"): STATE,
    ("omp/process.py", "orphanage.starting"): STATE,
    ("omp/rpc/output.py", "queue.direct"): STATE,
    ("omp/rpc/output.py", "queue.delivered"): STATE,
    ("omp/session/aborts.py", "unit.done"): STATE,
    ("omp/session/aborts.py", "unit.holders"): STATE,
    ("omp/session/aborts.py", "unit.family"): STATE,
    ("omp/session/jobs.py", "job.status"): STATE,
    ("omp/session/settings.py", "self.approval.mode"): NESTED,
    ("omp/session/settings.py", "self.todo_reminders.max"): NESTED,
    ("omp/session/settings.py", "self.todo_reminders.enabled"): NESTED,
    ("omp/session/settlement.py", "ticket.run"): STATE,
    ("omp/session/settlement.py", "ticket.ended"): STATE,
    ("omp/session/settlement.py", "ticket.command_running"): STATE,
    ("omp/subagents/child.py", "child.session_file"): RECORD,
    ("omp/subagents/host.py", "self.limiter.total_tokens"): (
        "trio's API: a CapacityLimiter is resized by setting it"),
    ("omp/subagents/host.py", "child.outcome"): STATE,
    ("omp/testing/fake_llm.py", "state.client_gone"): STATE,
    ("omp/testing/fake_llm.py", "state.client_eof"): STATE,
    ("omp/testing/fake_llm.py", "state.finished"): STATE,
    ("omp/testing/fake_llm.py", "entry.used"): STATE,
    ("omp/testing/fake_oauth.py", "device.interval"): STATE,
    ("omp/testing/fake_oauth.py", "device.last"): STATE,
    (
        "omp/testing/pytest_plugin.py",
        "hypothesis.inner_test",
    ): "hypothesis documents inner_test as the hook to wrap a test",
    ("omp/testing/transcript.py", "transcript._reader"): TEST_KIT,
    ("omp/testing/transcript.py", "transcript._writer"): TEST_KIT,
    ("omp/testing/transcript.py", "self._transcript.input_closed_at"): TEST_KIT,
    ("omp/tools/yield_tool.py", "self.state.failures"): STATE,
    ("omp/tools/yield_tool.py", "self.state.result"): STATE,
}
"""``(path from the repository root, the target as ast.unparse writes it)``: why it stays."""


Store = tuple[str, int, str]
"""``(path, line, target)``"""


def _constructs(call: ast.expr) -> bool:
    """Whether ``call`` calls a constructor: ``Foo(...)``, ``mod.Foo(...)``, ``Foo.make(...)``,
    or ``cls(...)`` in a classmethod."""
    if not isinstance(call, ast.Call):
        return False
    parts = ast.unparse(call.func).split(".")
    return parts[0] == "cls" or any(part[:1].isupper() for part in parts)


def _constructed_locals(scope: ast.AST) -> set[str]:
    """The names ``scope`` binds to a constructor call, not looking into nested functions."""
    names: set[str] = set()
    for node in _walk_scope(scope):
        if isinstance(node, ast.Assign) and _constructs(node.value):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
        elif (
            isinstance(node, ast.AnnAssign)
            and node.value is not None
            and isinstance(node.target, ast.Name)
            and _constructs(node.value)
        ):
            names.add(node.target.id)
    return names


def _walk_scope(scope: ast.AST) -> Iterator[ast.AST]:
    """Every node of ``scope`` that is not inside a function or class nested in it."""
    stack = list(ast.iter_child_nodes(scope))
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda | ast.ClassDef):
            stack.extend(ast.iter_child_nodes(node))


def _scopes(tree: ast.Module) -> Iterator[ast.AST]:
    yield tree
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            yield node


def stores_in(path: Path, relative: str) -> list[Store]:
    """The stores in one file that the policy does not allow by itself."""
    tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    found: list[Store] = []
    for scope in _scopes(tree):
        constructed = _constructed_locals(scope)
        for node in _walk_scope(scope):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                for sub in ast.walk(target):
                    if not (isinstance(sub, ast.Attribute) and isinstance(sub.ctx, ast.Store)):
                        continue
                    base = sub.value
                    if isinstance(base, ast.Name) and (base.id in OWN or base.id in constructed):
                        continue
                    if sub.attr in CANCEL_SCOPE_FIELDS or sub.attr in EXCEPTION_FIELDS:
                        continue
                    found.append((relative, node.lineno, ast.unparse(sub)))
    return sorted(found, key=lambda store: store[1])


def scan(root: Path = ROOT) -> list[Store]:
    """Every store under ``root/omp`` that the policy does not allow by itself."""
    found: list[Store] = []
    for path in sorted((root / "omp").rglob("*.py")):
        found.extend(stores_in(path, path.relative_to(root).as_posix()))
    return found


def problems(found: list[Store], allowed: dict[tuple[str, str], str] = ALLOWED) -> list[str]:
    """What fails the check: stores not on the list, and entries whose store is gone."""
    out = [
        f"{path}:{line}: {target} = ...: pass it in the constructor, or give the owning "
        f"class a method that says what happens (scripts/check_attribute_stores.py)"
        for path, line, target in found
        if (path, target) not in allowed
    ]
    seen = {(path, target) for path, _, target in found}
    out.extend(
        f"{path}: {target}: listed in ALLOWED but no longer stored; remove the entry"
        for path, target in allowed
        if (path, target) not in seen
    )
    return out


def main() -> int:
    failures = problems(scan())
    for failure in failures:
        print(failure)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
