"""A session's background jobs (``omp.session.jobs``): what the model is told when they end."""

from __future__ import annotations

from pathlib import Path

from omp.session.jobs import (
    DELIVERY_HEAD_CHARS,
    DELIVERY_MAX_CHARS,
    DELIVERY_TAIL_CHARS,
    Job,
    async_result_message,
    delivered_text,
)
from omp.tools.base import Settled

# --- the delivery's text -----------------------------------------------------------------------


def test_a_short_text_is_delivered_whole_naming_the_kept_output() -> None:
    assert delivered_text(Settled("all of it")) == "all of it"
    kept = Path("/tmp/omp-bash-0123456789abcdef.log")
    assert delivered_text(Settled("all of it", output_file=kept)) == (
        f"all of it\n\nFull output: {kept}")
    named = f"cut\n\n[Showing lines 1-2 and 9-10 of 10 (1KB elided). Full output: {kept}]"
    assert delivered_text(Settled(named, output_file=kept)) == named  # named once


def test_a_long_text_is_delivered_as_a_preview() -> None:
    text = "".join(f"line {n}\n" for n in range(5000))
    assert len(text) > DELIVERY_MAX_CHARS
    head_only = delivered_text(Settled(text))
    assert head_only == (text[:DELIVERY_HEAD_CHARS] + "\n[Output truncated. Showing first "
                         f"{DELIVERY_HEAD_CHARS:,} characters.]")
    # Kept in a file (a command's): the head, the end (exit code, notices), and the file.
    kept = Path("/tmp/omp-bash-0123456789abcdef.log")
    preview = delivered_text(Settled(text + "Command exited with code 2", output_file=kept))
    assert len(preview) < DELIVERY_HEAD_CHARS + 300
    assert preview.startswith(text[:DELIVERY_HEAD_CHARS - DELIVERY_TAIL_CHARS])
    assert "Command exited with code 2\n\n[Output truncated." in preview
    assert preview.endswith(f"Full output: {kept}]")


def test_jobs_settling_together_are_one_message() -> None:
    message = async_result_message([
        (Job("bg_1", "bash", "make test"), Settled("ok", duration_ms=1500.4)),
        (Job("Scout", "task", "Scout"), Settled("found it", "failed"))])
    assert message.customType == "async-result"
    assert message.content == (
        "<system-notice>\n2 background jobs have completed. Resume your work using the results "
        "below.\n── Job bg_1 (make test) ──\nok\n── Job Scout (Scout) ──\nfound it\n"
        "</system-notice>")
    assert message.details["jobs"] == [
        {"jobId": "bg_1", "type": "bash", "label": "make test", "durationMs": 1500},
        {"jobId": "Scout", "type": "task", "label": "Scout", "durationMs": 0}]
    (single,) = [async_result_message([(Job("bg_2", "bash", "false"),
                                        Settled("exit 1", "failed"))]).content]
    assert single == ("<system-notice>\nBackground job bg_2 has failed. Resume your work using "
                      "the result below.\nexit 1\n</system-notice>")
