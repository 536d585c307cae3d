"""Power loss of one machine, modelled for one process: the ``powerloss`` shim keeps a durable
shadow of its store directory (what a disk would still hold: only synced data, names as of the
last sync; see ``powerloss.c`` for the model), and ``lose_power`` replaces the directory by it
once the process is dead."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.faults import preload_env


def powerloss_env(watch: Path, shadow: Path) -> dict[str, str]:
    """The variables a process needs to keep ``shadow`` as the durable state of ``watch``."""
    env = preload_env(
        "powerloss", TIDEMQ_POWERLOSS_WATCH=str(watch), TIDEMQ_POWERLOSS_SHADOW=str(shadow)
    )
    return {k: env[k] for k in ("LD_PRELOAD", "TIDEMQ_POWERLOSS_WATCH", "TIDEMQ_POWERLOSS_SHADOW")}


def lose_power(watch: Path, shadow: Path) -> None:
    """Replace ``watch`` by what its shadow says survived; the process writing it must be dead.

    A file is its synced bytes cut or zero-padded to its size at the last sync; a directory or
    file no sync saw is gone. The shadow stays as it is: it describes the rebuilt directory."""
    names = shadow / "namespace"
    entries = names.read_text().splitlines() if names.exists() else []
    shutil.rmtree(watch, ignore_errors=True)
    watch.mkdir(parents=True)
    for line in entries:
        kind, *fields = line.split("\t")
        if kind == "d":
            (watch / fields[0]).mkdir(parents=True, exist_ok=True)
            continue
        key, size, rel = fields[0], int(fields[1]), fields[2]
        blob = shadow / "blobs" / key
        data = blob.read_bytes()[:size] if blob.exists() else b""
        target = watch / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        with open(target, "wb") as f:
            f.write(data)
            f.truncate(size)  # never synced past here: reads back as zeros
        os.chmod(target, 0o644)
