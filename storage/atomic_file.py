"""Small files replaced atomically (configs, consumer offsets, store metadata).

Write a temp file, fsync it, rename it over the target, fsync the directory: a crash at any point
leaves either the old content or the new, never a torn mix. The previous version stays as
``.bak`` so a reader can fall back if the newest is unreadable.
"""

from __future__ import annotations

import contextlib
import json
import os
from collections.abc import Callable
from typing import Any


def fsync_dir(directory: str) -> None:
    fd = os.open(directory or ".", os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def write_atomic(path: str, data: bytes, *, keep_backup: bool = True) -> None:
    directory = os.path.dirname(os.path.abspath(path))
    tmp = f"{path}.tmp"
    fd = os.open(tmp, os.O_CREAT | os.O_TRUNC | os.O_WRONLY, 0o644)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    if keep_backup and os.path.exists(path):
        # A hard link keeps the old version readable as .bak without a window where the target
        # is missing.
        bak = f"{path}.bak"
        with contextlib.suppress(FileNotFoundError):
            os.unlink(bak)
        os.link(path, bak)
    os.replace(tmp, path)
    fsync_dir(directory)


def _first_readable(path: str, parse: Callable[[bytes], Any]) -> Any | None:
    """``parse`` of the file's bytes, or of its ``.bak`` when the file is missing, empty or
    unparsable (``parse`` raising ValueError); None if neither will do."""
    for candidate in (path, f"{path}.bak"):
        try:
            with open(candidate, "rb") as f:
                data = f.read()
            if data:
                return parse(data)
        except (FileNotFoundError, ValueError):
            continue
    return None


def read_with_fallback(path: str) -> bytes | None:
    """The file's bytes, or its ``.bak`` when the file is missing or empty; None if neither."""
    data: bytes | None = _first_readable(path, bytes)
    return data


def write_json_atomic(path: str, obj: Any, *, compact: bool = False) -> None:
    """``compact`` for large tables: Python's C encoder serves only output without
    indentation, about three times faster, and the file is a third smaller."""
    if compact:
        text = json.dumps(obj, sort_keys=True, separators=(",", ":"))
    else:
        text = json.dumps(obj, indent=2, sort_keys=True)
    write_atomic(path, text.encode() + b"\n")


def read_json_with_fallback(path: str) -> Any | None:
    """Parsed JSON of the file, falling back to ``.bak`` when the newest is empty or unparsable."""
    return _first_readable(path, json.loads)
