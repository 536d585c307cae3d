"""Faults below the broker, injected into real processes with ``LD_PRELOAD`` shims.

A shim is a small C file here, compiled on first use with the machine's gcc into a cache folder
keyed by its source's hash; a test starts a broker (or a store process) with ``preload_env``
so the shim's versions of libc calls (``msync``, ``fsync``, ``fallocate``, ...) run instead of
libc's. Python's ``mmap.flush`` and ``os.fsync`` call libc, so the process under test meets the
fault exactly where a failing disk would give it one.
"""

from __future__ import annotations

import hashlib
import os
import subprocess
import tempfile
from pathlib import Path

_HERE = Path(__file__).parent
_CACHE = Path(tempfile.gettempdir()) / "tidemq-preload"


def build_shim(name: str) -> Path:
    """The shared object compiled from ``tests/faults/<name>.c`` (cached by source hash)."""
    source = _HERE / f"{name}.c"
    digest = hashlib.sha256(source.read_bytes()).hexdigest()[:16]
    target = _CACHE / f"{name}-{digest}.so"
    if not target.exists():
        _CACHE.mkdir(parents=True, exist_ok=True)
        # Built beside the target and renamed: two test processes may build it at once.
        fd, tmp = tempfile.mkstemp(dir=_CACHE, suffix=".so")
        os.close(fd)
        subprocess.run(
            ["gcc", "-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-o", tmp, str(source), "-ldl"],
            check=True,
            capture_output=True,
        )
        os.replace(tmp, target)
    return target


def preload_env(name: str, **settings: str) -> dict[str, str]:
    """Environment for a child process running with the shim ``name`` and its settings."""
    env = dict(os.environ)
    shim = str(build_shim(name))
    env["LD_PRELOAD"] = f"{shim} {env['LD_PRELOAD']}" if env.get("LD_PRELOAD") else shim
    env.update(settings)
    return env
