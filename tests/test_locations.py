"""Where session files live (omp.session.locations): per-cwd directory names, the newest
session in a directory."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from session_helpers import SAMPLE_1, user

from omp.session.file import SessionFile
from omp.session.locations import encode_cwd, newest_session, sessions_dir


def test_cwd_encoding(tmp_path: Path) -> None:
    home, tmp = "/home/user", "/tmp"
    assert encode_cwd("/home/user/proj/x", home=home, tmp=tmp) == "-proj-x"
    assert encode_cwd("/home/user", home=home, tmp=tmp) == "-"
    assert encode_cwd("/tmp/abc/d", home=home, tmp=tmp) == "-tmp-abc-d"
    assert encode_cwd("/tmp", home=home, tmp=tmp) == "-tmp"
    assert encode_cwd("/work/repo", home=home, tmp=tmp) == "--work-repo--"
    assert encode_cwd("/home/user2/p", home=home, tmp=tmp) == "--home-user2-p--"
    # The sample's directory: a cwd outside home and the temp dir gets pi's form.
    assert encode_cwd("/home/user/project", home="/nonexistent", tmp="/nonexistent-tmp") == (
        "--home-user-project--")
    assert sessions_dir("/agent", "/work/repo", home=home, tmp=tmp) == Path(
        "/agent/sessions/--work-repo--")
    # Symlinks are resolved.
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    assert encode_cwd(tmp_path / "link", home="/nonexistent", tmp=tmp_path) == "-tmp-real"


def test_newest_session(tmp_path: Path) -> None:
    assert newest_session(tmp_path / "missing") is None
    assert newest_session(tmp_path) is None
    older = SessionFile.create(tmp_path, cwd="/p")
    older.append_message(user("q"))
    newer = SessionFile.create(tmp_path, cwd="/p")
    (tmp_path / "junk.jsonl").write_text("not a session\n")
    os.utime(older.path, (1_000_000, 1_000_000))
    os.utime(newer.path, (2_000_000, 2_000_000))
    os.utime(tmp_path / "junk.jsonl", (3_000_000, 3_000_000))
    assert newest_session(tmp_path) == newer.path
    assert newest_session(tmp_path, non_empty=True) == older.path


def test_newest_session_accepts_the_title_slot_layout(tmp_path: Path) -> None:
    shutil.copyfile(SAMPLE_1, tmp_path / SAMPLE_1.name)
    assert newest_session(tmp_path, non_empty=True) == tmp_path / SAMPLE_1.name
