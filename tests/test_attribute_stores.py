"""``scripts/check_attribute_stores.py``: no assignment to another object's attribute in
``omp/`` beyond its policy and its allowlist (issue 39), and the check's own rules on small
sources."""

from __future__ import annotations

import textwrap
from pathlib import Path

from repo_files import load_repo_file

ROOT = Path(__file__).resolve().parent.parent


script = load_repo_file("scripts/check_attribute_stores.py")


def targets(tmp_path: Path, source: str) -> list[str]:
    path = tmp_path / "m.py"
    path.write_text(textwrap.dedent(source))
    return [target for _, _, target in script.stores_in(path, "m.py")]


def test_omp_stores_only_what_the_allowlist_names() -> None:
    found = script.scan()
    assert found  # the walk found the code
    assert script.problems(found) == []


def test_a_store_on_another_object_is_found(tmp_path: Path) -> None:
    assert targets(
        tmp_path,
        """
        def wire(runtime, session):
            runtime.mcp = 1
            session.tool_context.jobs += 1
            session.agent.hooks: int = 2
            a.x, b.y = 1, 2
        class C:
            def f(self):
                self.a = 1
                self.agent.gate = 1
        """,
    ) == [
        "runtime.mcp",
        "session.tool_context.jobs",
        "session.agent.hooks",
        "a.x",
        "b.y",
        "self.agent.gate",
    ]


def test_the_policy_allows_scopes_exceptions_and_records_being_filled(tmp_path: Path) -> None:
    assert targets(
        tmp_path,
        """
        def f(scope, error):
            scope.deadline = 1
            scope.shield = True
            error.__cause__ = None
            error.__notes__ = []
            record = Record()
            record.name = "x"
            other = module.Thing.make()
            other.field = 1
            made: Record = Record()
            made.field = 2
            def inner():
                record.late = 1
        class Registry:
            @classmethod
            def load(cls):
                registry = cls()
                registry.credentials = 1
        """,
    ) == ["record.late"]


def test_a_new_store_and_a_stale_entry_both_fail() -> None:
    allowed = {("omp/a.py", "x.y"): "why", ("omp/gone.py", "x.z"): "why"}
    failures = script.problems([("omp/a.py", 3, "x.y"), ("omp/b.py", 7, "w.v")], allowed)
    assert len(failures) == 2
    assert failures[0].startswith("omp/b.py:7: w.v = ...")
    assert failures[1].startswith("omp/gone.py: x.z: listed in ALLOWED but no longer stored")
