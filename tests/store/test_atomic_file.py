"""Atomic small files: a reader sees the old content or the new, and falls back to .bak."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tidemq.storage.atomic_file import read_json_with_fallback, read_with_fallback, write_atomic

pytestmark = pytest.mark.store

WRITER = """
import os, signal, sys
import tidemq.storage.atomic_file as a
path, stage = sys.argv[1], sys.argv[2]
real_replace = os.replace
def dying_replace(src, dst):
    if stage == "before-rename":
        os.kill(os.getpid(), signal.SIGKILL)
    real_replace(src, dst)
    os.kill(os.getpid(), signal.SIGKILL)
a.os.replace = dying_replace
a.write_json_atomic(path, {"version": 2})
"""


def test_replace_keeps_the_previous_version_as_bak(tmp_path: Path) -> None:
    path = str(tmp_path / "offsets.json")
    write_atomic(path, b'{"v": 1}')
    write_atomic(path, b'{"v": 2}')
    assert Path(path).read_bytes() == b'{"v": 2}'
    assert Path(path + ".bak").read_bytes() == b'{"v": 1}'
    assert not os.path.exists(path + ".tmp")


def test_an_empty_or_unparsable_file_falls_back_to_bak(tmp_path: Path) -> None:
    path = str(tmp_path / "topics.json")
    write_atomic(path, b'{"v": 1}')
    write_atomic(path, b'{"v": 2}')
    Path(path).write_bytes(b"")
    assert read_with_fallback(path) == b'{"v": 1}'
    Path(path).write_bytes(b'{"v": ')
    assert read_json_with_fallback(path) == {"v": 1}
    assert read_json_with_fallback(str(tmp_path / "missing.json")) is None


@pytest.mark.parametrize(("stage", "expected"), [("before-rename", 1), ("after-rename", 2)])
def test_a_kill_around_the_rename_leaves_old_or_new_never_torn(
    tmp_path: Path, stage: str, expected: int
) -> None:
    path = tmp_path / "offsets.json"
    write_atomic(str(path), json.dumps({"version": 1}).encode())
    proc = subprocess.run(
        [sys.executable, "-c", WRITER, str(path), stage],
        env={**os.environ, "PYTHONPATH": str(Path(__file__).parents[2])},
        check=False,
        timeout=60,
    )
    assert proc.returncode == -9
    assert read_json_with_fallback(str(path)) == {"version": expected}
