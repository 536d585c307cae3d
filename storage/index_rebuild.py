"""Rebuilding the message key index in a helper process while recovery rebuilds ConsumeQueues.

A recovery that re-dispatches much of the CommitLog (no checkpoint, lost index files, or dispatch
far behind at the crash) spends about 40 % of its time hashing keys and writing index entries,
all of it Python bytecode under one GIL. That work needs nothing from the ConsumeQueues, so a
second process does it on the other core: the recovering process walks and CRC-checks the log,
writes queue entries, and sends each batch of keyed messages down a pipe; the helper indexes
them with the same ``IndexService`` code, into the same files, in the same order. The result is
the same bytes as an in-process rebuild (pinned by tests), in about two thirds of the time.

The helper only ever sees messages the parent has already validated, and it is the index's only
writer while it runs (the parent closes its own mapping first and loads the files again after).
If it dies, the parent notices (a broken pipe or a failed answer), loads whatever reached the
files (``IndexService.load`` rolls back a torn put) and indexes the rest itself, so a helper's
failure costs time, never keys.

Wire format, parent to helper on the helper's stdin: frames of a big-endian uint32 length and
that many bytes of pickle (a list of ``(topic, phy_offset, store_timestamp_ms, [key bytes])``);
a zero length ends the stream. The helper answers with one JSON line on stdout,
``{"indexed": N}`` or ``{"error": "...", "type": "..."}``. Both ends are this module of the same
installation, so the format carries no version.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import pickle
import struct
import subprocess
import sys
from collections.abc import Sequence
from typing import BinaryIO

from tidemq.storage.dispatch import Dispatcher
from tidemq.storage.errors import CorruptStoreError
from tidemq.storage.index_service import IndexService

log = logging.getLogger(__name__)

_LENGTH = struct.Struct(">I")
# The pipe is widened so the parent rarely waits for the helper to drain a batch: a batch of
# 1,024 keyed messages pickles to about 100 KiB, more than a default pipe's 64 KiB.
_PIPE_BYTES = 1 << 20

# Not ``-m``: the storage package imports this module, and runpy warns when it runs a module
# that its own package has imported already.
_HELPER_MAIN = (
    "import sys; from tidemq.storage.index_rebuild import main; sys.exit(main(sys.argv[1:]))"
)

IndexedMessages = Sequence[tuple[str, int, int, Sequence[bytes]]]


class IndexRebuildWorker:
    """The parent's end: start the helper, ``submit`` batches in log order, then ``finish``.

    ``submit`` never raises for the helper's sake: once the helper is gone, later batches are
    dropped and ``finish`` returns why, so the caller can index the rest itself.
    """

    def __init__(
        self, directory: str, slot_num: int, max_index_num: int, hold_fd: int | None = None
    ) -> None:
        """``hold_fd``: a descriptor the helper keeps open until it exits: the store lock's, so
        that if this process dies first the store stays locked until the helper, which drains
        what is left in its pipe before it notices, has stopped writing."""
        # The folder holding the top-level package: one level up per dot in this module's name.
        package_root = os.path.abspath(__file__)
        for _ in range(__name__.count(".") + 1):
            package_root = os.path.dirname(package_root)
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(
            p for p in (package_root, env.get("PYTHONPATH", "")) if p
        )
        # -P: do not put the working directory first on sys.path, so the helper runs this
        # installation's tidemq package and not whatever "tidemq" the working directory holds.
        self._proc = subprocess.Popen(
            [
                sys.executable,
                "-P",
                "-c",
                _HELPER_MAIN,
                directory,
                f"{slot_num}",
                f"{max_index_num}",
            ],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            env=env,
            pass_fds=() if hold_fd is None else (hold_fd,),
        )
        assert self._proc.stdin is not None
        # Above /proc/sys/fs/pipe-max-size this fails: the default pipe works, only slower.
        with contextlib.suppress(OSError):
            fcntl.fcntl(self._proc.stdin.fileno(), fcntl.F_SETPIPE_SZ, _PIPE_BYTES)
        self._broken: str | None = None  # why writing to the helper failed
        self.submitted = 0

    @property
    def pid(self) -> int:
        return self._proc.pid

    def submit(self, messages: IndexedMessages) -> None:
        if self._broken is not None or not messages:
            return
        data = pickle.dumps(messages, pickle.HIGHEST_PROTOCOL)
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(_LENGTH.pack(len(data)))
            self._proc.stdin.write(data)
        except OSError as e:  # BrokenPipeError: the helper is gone
            self._broken = f"index helper {self._proc.pid} stopped reading: {e}"
            return
        self.submitted += len(messages)

    def finish(self) -> str | None:
        """End the stream and wait for the helper; None when it indexed everything submitted,
        else why not."""
        stdin, stdout = self._proc.stdin, self._proc.stdout
        assert stdin is not None
        assert stdout is not None
        try:
            if self._broken is None:
                stdin.write(_LENGTH.pack(0))
            stdin.close()
        except OSError as e:
            self._broken = self._broken or f"index helper {self._proc.pid} stopped reading: {e}"
        answer = stdout.read()
        stdout.close()
        code = self._proc.wait()
        return _judge(answer, code, self.submitted, self._proc.pid, self._broken)

    def kill(self) -> None:
        """Stop the helper at once (the caller gave up on this recovery)."""
        if self._proc.poll() is None:
            self._proc.kill()
        self._proc.wait()
        for pipe in (self._proc.stdin, self._proc.stdout):
            if pipe is not None:
                # Closing stdin flushes what is buffered into a dead helper.
                with contextlib.suppress(OSError):
                    pipe.close()


class HelperIndexSink:
    """Dispatch's index sink for recovery passes: index in this process until a pass has covered
    ``min_bytes`` of log (a small re-dispatch is not worth a process), then start a helper and
    hand it the rest. Whether that happened, and how it ended, stays in ``used``/``failure``."""

    def __init__(self, index: IndexService, min_bytes: int | None, lock_fd: int | None) -> None:
        self.index = index
        self.min_bytes = min_bytes
        self.lock_fd = lock_fd
        self.used = False
        self.failure: str | None = None
        self._start = 0
        self._worker: IndexRebuildWorker | None = None

    def begin(self, start: int) -> None:
        """A pass starts at CommitLog offset ``start``."""
        self._start = start

    def __call__(self, messages: IndexedMessages) -> None:
        due = self.min_bytes is not None and messages[0][1] - self._start >= self.min_bytes
        if self._worker is None and due:
            self._start_worker()
        if self._worker is not None:
            self._worker.submit(messages)
        else:
            self.index.build_index_many(messages)

    def _start_worker(self) -> None:
        index = self.index
        index.close(flush=False)
        try:
            self._worker = IndexRebuildWorker(
                index.directory, index.slot_num, index.max_index_num, self.lock_fd
            )
        except OSError as e:
            log.warning("could not start the index helper (%s); indexing in this process", e)
            self.min_bytes = None
            index.load()
            return
        self.used = True

    def abandon(self) -> None:
        """The pass failed: stop the helper and take the index back as it is."""
        worker, self._worker = self._worker, None
        if worker is not None:
            worker.kill()
            self.index.load()

    def finish(self, dispatcher: Dispatcher, complete: bool, prefill: bool) -> None:
        """The pass ended at ``dispatcher.offset``: wait for the helper and take the index back.
        If the helper fell short and the pass is ``complete`` (to be kept), index the rest here:
        dispatch again from the last message the helper indexed (queue entries are already there
        and are skipped; a message it indexed halfway is completed)."""
        worker, self._worker = self._worker, None
        if worker is None:
            return
        failure = worker.finish()
        self.index.load()
        if failure is None or not complete:
            return
        self.failure = failure
        log.warning("%s; indexing the rest in this process", failure)
        reached, stopped_at, error = dispatcher.offset, dispatcher.stopped_at, dispatcher.error
        dispatcher.offset = max(self._start, self.index.end_phy_offset)
        dispatcher.dispatch(reached, allow_prefill=prefill)
        if dispatcher.offset != reached:
            raise CorruptStoreError(
                f"re-indexing stopped at {dispatcher.offset}, short of {reached} where the "
                f"dispatch pass ended: {dispatcher.stopped_at}"
            )
        dispatcher.stopped_at, dispatcher.error = stopped_at, error


def _judge(answer: bytes, code: int, submitted: int, pid: int, broken: str | None) -> str | None:
    """None when the helper indexed all it was sent; else why not, in its own words if it said."""
    try:
        result = json.loads(answer.decode() or "null")
    except ValueError:
        result = None
    if isinstance(result, dict) and "error" in result:
        return f"index helper {pid} failed: {result.get('type')}: {result['error']}"
    indexed = result.get("indexed") if isinstance(result, dict) else None
    if broken is None and code == 0 and indexed == submitted:
        return None
    return broken or f"index helper {pid} exited with {code} after answering {answer[:200]!r}"


def _read_exactly(stream: BinaryIO, n: int) -> bytes:
    data = stream.read(n)
    if len(data) != n:
        raise EOFError(f"the recovering process went away ({len(data)} of {n} bytes)")
    return data


def main(argv: Sequence[str]) -> int:
    """The helper: index what arrives on stdin into the index at ``argv[0]``."""
    directory, slot_num, max_index_num = argv
    logging.basicConfig(level=logging.WARNING, format="index helper: %(levelname)s %(message)s")
    out = sys.stdout
    stdin = sys.stdin.buffer
    indexed = 0
    try:
        service = IndexService(directory, int(slot_num), int(max_index_num))
        service.load()
        try:
            while True:
                (n,) = _LENGTH.unpack(_read_exactly(stdin, _LENGTH.size))
                if n == 0:
                    break
                batch = pickle.loads(_read_exactly(stdin, n))
                service.build_index_many(batch)
                indexed += len(batch)
        finally:
            # No flush: an in-process rebuild leaves the pages to the store's flusher too.
            service.close(flush=False)
    except Exception as e:  # reported to the parent, which indexes the rest itself
        log.exception("rebuilding the index in %s failed after %d messages", directory, indexed)
        out.write(json.dumps({"error": str(e), "type": type(e).__name__}) + "\n")
        return 1
    out.write(json.dumps({"indexed": indexed}) + "\n")
    return 0
