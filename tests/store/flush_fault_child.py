"""Child of test_flush's failed-flush test: a real store under the ``diskfault`` shim, whose
CommitLog flush starts failing with EIO mid-run. Prints one JSON line of what it saw.

Usage: flush_fault_child.py STORE_DIR (TIDEMQ_DISKFAULT_CONTROL names the control file)."""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable
from pathlib import Path

from tests.faults.disk import CONTROL_ENV
from tests.store.conftest import tiny_config
from tidemq.storage import FlushMode, Message, MessageStore, PutStatus


def outcome(put: Callable[[], PutStatus]) -> str:
    try:
        return put().name
    except Exception as e:  # noqa: BLE001 - what it raised is the answer
        return f"{type(e).__name__}: {e}"


def main() -> None:
    root = Path(sys.argv[1])
    control = Path(os.environ[CONTROL_ENV])
    store = MessageStore(tiny_config(root, flush_mode=FlushMode.SYNC)).open()

    def put(body: bytes) -> str:
        return outcome(lambda: store.put_messages([Message("t", body)]).wait(10))

    before = [put(f"ok-{i}".encode()) for i in range(5)]
    control.write_text(f"fdatasync EIO {root / 'commitlog'}\n")
    failed = put(b"flush fails")
    later = put(b"after")
    failure = store.failure
    report = {
        "before": before,
        "failed": failed,
        "later": later,
        "failure": failure.reason if failure else None,
        "writable": store.stats().writable,
    }
    store.close()
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
