"""The process's exit waits for the session files' writer threads (omp.session.writer).

A server ended by a signal is cancelled, not closed: its sessions' writer threads may still be
writing the last lines when ``main`` returns. ``omp.cli.entry`` ends at once when threads are
left running (extension threads must not keep the process alive), which for a writer thread
lost those lines; CI caught it as ``omp: not waiting for 1 thread(s) left running
(omp-session-writer ...)`` after a SIGINT.
"""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path

from omp.session.writer import LineWriter, join_writers


def test_join_writers_waits_for_a_writer_and_names_one_it_gave_up_on(tmp_path: Path) -> None:
    # A write into a missing directory fails; the failure report runs on the writer thread
    # before it counts as stopped, so holding the report holds the thread.
    release = threading.Event()
    reported: list[OSError] = []

    def report(exc: OSError) -> None:
        reported.append(exc)
        release.wait()

    writer = LineWriter(tmp_path / "missing" / "s.jsonl", on_failure=report)
    writer.append(b"{}\n")
    assert join_writers(timeout=0.05) == ["omp-session-writer s.jsonl"]
    release.set()
    assert join_writers() == []
    assert len(reported) == 1


EXIT_SCRIPT = """
import sys, threading
from pathlib import Path
from omp import cli
from omp.session.writer import LineWriter

marker = Path(sys.argv[1])
joined = threading.Event()
join = threading.Thread.join

def joining(self, timeout=None):
    joined.set()
    return join(self, timeout)

threading.Thread.join = joining

def slow_disk(exc):
    # The disk answers only once someone waits for it: the thread outlives main, and it ends
    # (writing the marker) only if the exit waits for it instead of ending the process.
    joined.wait()
    marker.write_text("reported")

def main():
    LineWriter(marker.parent / "missing" / "s.jsonl", on_failure=slow_disk).append(b"{}\\n")
    return 0

cli.main = main
sys.exit(cli.entry())
"""


def test_the_exit_waits_for_a_writer_still_writing(tmp_path: Path) -> None:
    marker = tmp_path / "marker"
    done = subprocess.run([sys.executable, "-c", EXIT_SCRIPT, str(marker)],
                          capture_output=True, timeout=60, check=False)
    assert done.returncode == 0, done.stderr
    assert b"not waiting" not in done.stderr
    assert marker.read_text() == "reported"
