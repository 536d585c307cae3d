"""Raw CommitLog bytes by global offset: read, damage (flip a bit, zero a range) and snapshot them,
and read the evidence recovery keeps of what it cut."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from tests.store.workload import FILE_SIZE
from tidemq.storage.record import HEADERS

BODY_AT = HEADERS[False, False].size  # 88: where the body starts in an IPv4 record


def commitlog_dir(root: str | Path) -> Path:
    return Path(root) / "commitlog"


def commitlog_files(root: str | Path) -> list[Path]:
    return sorted(p for p in commitlog_dir(root).iterdir() if p.name.isdigit())


def locate(root: str | Path, offset: int) -> tuple[Path, int]:
    """The CommitLog file holding a global offset (its name is its first byte's offset) and the
    position inside it."""
    base = offset - offset % FILE_SIZE
    path = commitlog_dir(root) / f"{base:020d}"
    assert path.exists(), f"no CommitLog file holds offset {offset}"
    return path, offset - base


def read_log(root: str | Path, offset: int, n: int) -> bytes:
    path, pos = locate(root, offset)
    assert pos + n <= FILE_SIZE
    with open(path, "rb") as f:
        f.seek(pos)
        return f.read(n)


def write_log(root: str | Path, offset: int, data: bytes) -> None:
    path, pos = locate(root, offset)
    assert pos + len(data) <= FILE_SIZE
    with open(path, "r+b") as f:
        f.seek(pos)
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def flip_bit(root: str | Path, offset: int, bit: int = 0) -> None:
    (b,) = read_log(root, offset, 1)
    write_log(root, offset, bytes([b ^ (1 << bit)]))


def zero_log(root: str | Path, offset: int, n: int) -> None:
    """Zero ``n`` bytes from a global offset, across file boundaries."""
    while n > 0:
        _, pos = locate(root, offset)
        k = min(n, FILE_SIZE - pos)
        write_log(root, offset, bytes(k))
        offset += k
        n -= k


def snapshot_log(root: str | Path) -> dict[int, bytes]:
    return {int(p.name): p.read_bytes() for p in commitlog_files(root)}


def evidence(root: str | Path) -> list[tuple[dict[str, Any], bytes, Path]]:
    """(note, saved bytes, path of the .bin) of every evidence file, lowest offset first."""
    d = Path(root) / "evidence"
    if not d.is_dir():
        return []
    out = []
    for b in sorted(d.glob("*.bin")):
        note = json.loads(b.with_suffix(".json").read_text())
        out.append((note, b.read_bytes(), b))
    return sorted(out, key=lambda x: (x[0]["offset"], x[2].name))
