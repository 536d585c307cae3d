"""``tidemq store check|dump|put``: offline tools for a broker's store directory.

Registered with the ``tidemq`` CLI through the ``tidemq.commands`` entry point. A store error is
one line on stderr, ``tidemq: CODE: message``, and exit code 2.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import sys
import time
from collections.abc import Callable

from tidemq.storage import FlushMode, Message, MessageStore, StoreConfig
from tidemq.storage.atomic_file import read_json_with_fallback
from tidemq.storage.check import check_store, dump_records
from tidemq.storage.errors import StoreError
from tidemq.storage.manifest import LAYOUT_FILE

Command = Callable[[argparse.Namespace], int]


def exits_on_store_error(command: Command) -> Command:
    """``command`` with a StoreError (bad config included) reported as one line, exit code 2."""

    @functools.wraps(command)
    def run(args: argparse.Namespace) -> int:
        try:
            return command(args)
        except StoreError as e:
            print(f"tidemq: {e.code}: {e}", file=sys.stderr)
            return 2

    return run


def _store_config(directory: str, **overrides: object) -> StoreConfig:
    """A config matching the layout the store was created with (store.json), if it exists."""
    layout = read_json_with_fallback(os.path.join(directory, LAYOUT_FILE)) or {}
    keys = (
        "commitlog_file_size_bytes",
        "consume_queue_entries_per_file",
        "index_slot_num",
        "index_max_num",
        "record_crc",
    )
    kwargs = {k: layout[k] for k in keys if k in layout}
    kwargs.update(overrides)
    return StoreConfig(directory, **kwargs)


@exits_on_store_error
def cmd_store_check(args: argparse.Namespace) -> int:
    report = check_store(args.dir)
    if args.json:
        print(json.dumps(report.as_dict(), indent=2))
    else:
        print(f"store {report.root}: {'OK' if report.ok else 'PROBLEMS FOUND'}")
        print(
            "  shutdown:        "
            + ("clean" if report.clean_shutdown else "not clean (recovery runs at next start)")
        )
        print(
            f"  CommitLog:       {report.commitlog_files} file(s), offsets "
            f"[{report.min_offset}, {report.max_offset}), {report.records} records, "
            f"{report.bytes} bytes"
        )
        for topic, n in sorted(report.topics.items()):
            print(f"    {topic}: {n} records")
        print(
            f"  ConsumeQueues:   {report.consume_queues} queue(s), "
            f"{report.consume_queue_entries} entries"
        )
        print(f"  Index:           {report.index_files} file(s), {report.index_entries} entries")
        if not report.ok:
            print(f"  problems:        {report.problem_count}; first: {report.problems[0]}")
            for p in report.problems[1:]:
                print(f"                   {p}")
    return 0 if report.ok else 1


@exits_on_store_error
def cmd_store_dump(args: argparse.Namespace) -> int:
    for shown, m in enumerate(dump_records(args.dir, args.topic)):
        if shown >= args.limit:
            break
        body = m.body[: args.body_bytes]
        stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(m.store_timestamp_ms / 1000))
        print(
            f"offset={m.phy_offset} size={m.size} topic={m.topic} queue={m.queue_id} "
            f"queue_offset={m.queue_offset} stored={stamp}.{m.store_timestamp_ms % 1000:03d}Z "
            f"msg_id={m.msg_id} tags={m.tags or ''} keys={','.join(m.keys)} "
            f"body={body!r}{'...' if len(m.body) > len(body) else ''}"
        )
    return 0


@exits_on_store_error
def cmd_store_put(args: argparse.Namespace) -> int:
    """Append messages to a local store (no broker): seeding data, trying the store out."""
    cfg = _store_config(args.dir, flush_mode=FlushMode.SYNC if args.sync else FlushMode.ASYNC)
    body = args.body.encode() if args.body else b"x" * args.body_bytes
    t0 = time.perf_counter()
    with MessageStore(cfg) as store:
        done = 0
        while done < args.count:
            n = min(args.batch, args.count - done)
            batch = [
                Message(
                    args.topic,
                    body,
                    queue_id=(done + i) % args.queues,
                    tags=args.tags,
                    keys=[f"{args.key_prefix}{done + i}"] if args.key_prefix else (),
                )
                for i in range(n)
            ]
            store.put_messages(batch).wait()
            done += n
        stats = store.stats()
    secs = time.perf_counter() - t0
    print(
        json.dumps(
            {
                "appended": done,
                "seconds": round(secs, 3),
                "commitlog_max_offset": stats.commitlog_max_offset,
                "recovery": None if stats.recovery is None else stats.recovery.__dict__,
            }
        )
    )
    return 0


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    store = sub.add_parser("store", help="offline tools for a broker's store directory")
    ssub = store.add_subparsers(dest="store_command", required=True)

    c = ssub.add_parser("check", help="verify every record, queue entry and index entry")
    c.add_argument("dir")
    c.add_argument("--json", action="store_true", help="print the report as JSON")
    c.set_defaults(func=cmd_store_check)

    d = ssub.add_parser("dump", help="print records for people")
    d.add_argument("dir")
    d.add_argument("--topic", help="only this topic")
    d.add_argument("--limit", type=int, default=100)
    d.add_argument("--body-bytes", type=int, default=64, help="body bytes shown per record")
    d.set_defaults(func=cmd_store_dump)

    u = ssub.add_parser("put", help="append messages to a store directly (no broker)")
    u.add_argument("dir")
    u.add_argument("--topic", required=True)
    u.add_argument("--count", type=int, default=1)
    u.add_argument("--queues", type=int, default=4)
    u.add_argument("--batch", type=int, default=256)
    u.add_argument("--body", help="message body (default: --body-bytes of 'x')")
    u.add_argument("--body-bytes", type=int, default=1024)
    u.add_argument("--tags")
    u.add_argument("--key-prefix", help="give message i the key PREFIX<i>")
    u.add_argument("--sync", action="store_true", help="sync flush (group commit)")
    u.set_defaults(func=cmd_store_put)
