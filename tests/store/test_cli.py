"""`tidemq store ...` as an operator runs it: a real process, exit codes, output."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.store


def tidemq(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    """The CLI as a process of its own, with ``env`` added to this one's environment."""
    return subprocess.run(
        [sys.executable, "-m", "tidemq.cli", *args],
        check=False,
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, **(env or {})},
    )


def small_store(tmp_path: Path) -> Path:
    root = tmp_path / "store"
    root.mkdir()
    # A tiny layout, as a test or a developer might create with a config file.
    (root / "store.json").write_text(
        json.dumps(
            {
                "format_version": 1,
                "commitlog_file_size_bytes": 4096,
                "consume_queue_entries_per_file": 16,
                "index_slot_num": 8,
                "index_max_num": 32,
                "record_crc": True,
            }
        )
    )
    return root


def test_put_check_dump(tmp_path: Path) -> None:
    root = small_store(tmp_path)
    r = tidemq(
        "store",
        "put",
        str(root),
        "--topic",
        "orders",
        "--count",
        "50",
        "--queues",
        "2",
        "--body-bytes",
        "100",
        "--tags",
        "created",
        "--key-prefix",
        "order-",
    )
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["appended"] == 50
    r = tidemq("store", "check", str(root), "--json")
    assert r.returncode == 0, r.stdout
    report = json.loads(r.stdout)
    assert report["ok"] and report["records"] == 50 and report["topics"] == {"orders": 50}
    assert report["consume_queue_entries"] == 50 and report["index_entries"] == 50
    r = tidemq("store", "dump", str(root), "--topic", "orders", "--limit", "3")
    lines = r.stdout.splitlines()
    assert r.returncode == 0 and len(lines) == 3
    assert (
        "queue_offset=0" in lines[0] and "keys=order-0" in lines[0] and "tags=created" in lines[0]
    )


def test_check_finds_a_flipped_bit_and_exits_1(tmp_path: Path) -> None:
    root = small_store(tmp_path)
    assert (
        tidemq(
            "store", "put", str(root), "--topic", "t", "--count", "30", "--body-bytes", "200"
        ).returncode
        == 0
    )
    second = root / "commitlog" / f"{4096:020d}"
    data = bytearray(second.read_bytes())
    data[150] ^= 0x01
    second.write_bytes(bytes(data))
    r = tidemq("store", "check", str(root))
    assert r.returncode == 1
    assert "PROBLEMS FOUND" in r.stdout and "CRC" in r.stdout


def test_bad_input_gets_a_typed_error_and_exit_2(tmp_path: Path) -> None:
    r = tidemq("store", "put", str(tmp_path / "s"), "--topic", "no spaces please")
    assert r.returncode == 2
    assert "INVALID_TOPIC" in r.stderr
    r = tidemq("store", "check", str(tmp_path / "nothing-here"))
    assert r.returncode == 2 and "not a tidemq store" in r.stderr
