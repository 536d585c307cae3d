"""Child process of the crash and corruption tests: opens a store and appends until killed.

Prints, flushing after each:
  ``R <abnormal 0|1> <cut bytes> <end offset> <pid>``  once the store is open (recovery done);
  ``B <seq>``                                         before each batch is handed to the store;
  ``A ...`` (see workload.Ack.line)                    per message, only after the batch's
                                                       future said PUT_OK (SYNC: flushed; ASYNC:
                                                       appended to the mapping, or with
                                                       ``--pool N`` committed to the file);
  ``D``                                                when ``--count`` messages are written and
                                                       ``--hold`` keeps it open until killed;
  ``L <error>`` (exit 4)                               when the store lock is held by another.

``--serve`` makes it a fork server instead: it imports everything once, then per line of stdin
(``<stdout fifo> <stderr file> <writer arguments...>``) forks a writer in its own session with
its stdout on the fifo, prints ``P <pid>``, and once that writer is gone ``X <pid> <wait
status>``. The crash test starts a hundred writers; each then costs a fork, not an interpreter
start and its imports.

Failpoints (the process SIGKILLs itself, after printing ``K <what> <offset> ...``):
  ``evidence-kill``  when recovery starts writing evidence (after the cut bytes were read);
  ``torn-record``    in the middle of the record write number ``--failpoint-after``: only a random
                     prefix of it reaches the mapping (``K torn <phy offset> <bytes> <nonzero>``);
  ``after-blank``    right after the blank marker number ``--failpoint-after`` is written, before
                     the batch goes on in the next file (``K blank <position> <remaining>``).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import random
import signal
import sys
import traceback
from typing import Any

from tests.store import workload
from tidemq.storage import FlushMode, PutStatus
from tidemq.storage.errors import StoreLockedError


def die(what: str) -> None:
    sys.stdout.write(f"K {what}\n")
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def arm(failpoint: str, after: int, rng: random.Random) -> None:
    # Typed as Any: the failpoints replace module functions and a method on purpose.
    commitlog: Any = importlib.import_module("tidemq.storage.commitlog")
    evidence_writer: Any = importlib.import_module("tidemq.storage.truncation").EvidenceWriter
    left = after
    if failpoint == "evidence-kill":

        def evidence_kill(_self: object, offset: int, data: bytes) -> None:
            die(f"evidence {offset} {len(data)}")

        evidence_writer.__call__ = evidence_kill
    elif failpoint == "torn-record":
        real_records = commitlog.write_records

        def torn_records(f: Any, pos: int, data: bytes) -> None:
            # ``data`` is whole records back to back: write the first ``left`` of them whole and
            # a random prefix of the next, as a kill in the middle of the copy would.
            nonlocal left
            at = 0
            while at < len(data):
                size = int.from_bytes(data[at : at + 4], "big")
                if left > 0:
                    left -= 1
                    at += size
                    continue
                k = rng.randint(1, size - 1)
                f.write_at(pos, data[: at + k])
                phy = int.from_bytes(data[at + 28 : at + 36], "big")
                die(f"torn {phy} {k} {int(any(data[at : at + k]))}")
            real_records(f, pos, data)

        commitlog.write_records = torn_records
    elif failpoint == "after-blank":
        mapped_file: Any = importlib.import_module("tidemq.storage.mapped_file").MappedFile
        real_blank = mapped_file.write_blank_end

        def after_blank(f: Any, pos: int) -> None:
            nonlocal left
            real_blank(f, pos)
            if left > 0:
                left -= 1
                return
            die(f"blank {pos} {f.size - pos}")

        mapped_file.write_blank_end = after_blank


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser()
    p.add_argument("store_dir")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--flush", choices=["SYNC", "ASYNC"], default="SYNC")
    p.add_argument("--count", type=int, default=-1, help="messages to write; -1: until killed")
    p.add_argument("--hold", action="store_true", help="after --count, stay open until killed")
    p.add_argument("--prefix", default="m", help="unique key prefix")
    p.add_argument("--checkpoint-ms", type=int, default=1000)
    p.add_argument("--reopen-after", type=int, default=-1, help="close and reopen after N")
    p.add_argument("--truncate-on-corruption", action="store_true")
    p.add_argument("--failpoint", choices=["evidence-kill", "torn-record", "after-blank"])
    p.add_argument("--failpoint-after", type=int, default=0)
    p.add_argument("--pool", type=int, default=0, help="transient store pool buffers (0: none)")
    args = p.parse_args(argv)
    if args.failpoint:
        arm(args.failpoint, args.failpoint_after, random.Random(args.seed + 1))

    cfg = workload.store_config(
        args.store_dir,
        FlushMode(args.flush),
        checkpoint_interval_ms=args.checkpoint_ms,
        consume_queue_flush_interval_ms=args.checkpoint_ms,
        truncate_on_corruption=args.truncate_on_corruption,
        transient_store_pool_enable=args.pool > 0,
        transient_store_pool_buffers=max(args.pool, 1),
    )
    try:
        s = workload.start_store(cfg)
    except StoreLockedError as e:
        print(f"L {type(e).__name__}: {e}", flush=True)
        return 4
    rec = s.recovery
    assert rec is not None
    print(f"R {int(rec.abnormal)} {rec.cut_bytes} {rec.end_offset} {os.getpid()}", flush=True)

    rng = random.Random(args.seed)
    seq = 0
    reopened = False
    out = sys.stdout
    while args.count < 0 or seq < args.count:
        if not reopened and 0 <= args.reopen_after <= seq:
            reopened = True
            s.close()
            s = workload.start_store(cfg)
        plan = workload.plan_batch(rng, args.prefix, seq)
        if args.count >= 0:
            plan = plan[: args.count - seq]
        out.write(f"B {seq}\n")
        out.flush()
        r = s.put_messages([m.message() for m in plan])
        status = r.wait(60)
        if status is not PutStatus.PUT_OK:
            print(f"E {status}", flush=True)
            return 3
        out.write(
            "".join(workload.Ack.of(m, res).line() for m, res in zip(plan, r.results, strict=True))
        )
        out.flush()
        seq += len(plan)
    if args.hold:
        print("D", flush=True)
        sys.stdin.read()  # until the parent kills us (or closes our stdin)
    s.close()
    print("C", flush=True)
    return 0


def forked_writer(out_path: str, err_path: str, out_fd: int, argv: list[str]) -> None:
    """In the forked child: a session of its own, stdout on the fifo, stderr to the file, stdin
    empty; then run the writer and leave without the server's cleanup."""
    code = 1
    try:
        os.setsid()
        err_fd = os.open(err_path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
        null_fd = os.open(os.devnull, os.O_RDONLY)
        for fd, target in ((null_fd, 0), (out_fd, 1), (err_fd, 2)):
            os.dup2(fd, target)
            os.close(fd)
        sys.stdin = open(0, closefd=False)  # noqa: SIM115 - the process's own fds
        sys.stdout = open(1, "w", closefd=False)  # noqa: SIM115
        sys.stderr = open(2, "w", closefd=False)  # noqa: SIM115
        code = main(argv)
    except BaseException:  # noqa: BLE001 - reported on stderr; the exit code says it failed
        traceback.print_exc()
    finally:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)


def serve() -> int:
    """The fork server's loop (see the module docstring)."""
    for line in sys.stdin:
        out_path, err_path, *argv = line.split()
        # Opened here, before the fork, so the fifo has its writer before the parent reads "P":
        # the parent's first read can never see an end of file that only means "not yet".
        out_fd = os.open(out_path, os.O_WRONLY)
        sys.stdout.flush()
        pid = os.fork()
        if pid == 0:
            forked_writer(out_path, err_path, out_fd, argv)
        os.close(out_fd)
        print(f"P {pid}", flush=True)
        _, status = os.waitpid(pid, 0)
        print(f"X {pid} {status}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(serve() if sys.argv[1:] == ["--serve"] else main())
