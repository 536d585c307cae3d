"""Archive and tiered storage over real processes (docs/archive.md): a broker archives expired
CommitLog files to a real S3 API (moto's server on loopback, behind a gate the test controls)
before retention deletes them, and serves pulls past local retention from the archive with the
same bytes; killed mid-upload it resumes without loss or duplicates; an unreachable archive
stops deletion and says so; a corrupted archived object is refused, never served.

CommitLog files are 64 KiB and archived in 8 KiB chunks, so a few hundred messages cross several
files and every file takes many uploads."""

from __future__ import annotations

import json
from collections.abc import Iterator

import boto3
import grpc
import pytest

from tests.integration import replicas
from tests.integration.conftest import BrokerProcess, NameServerProcess, StartBroker, free_port
from tests.integration.replicas import QUEUES, create_topic, status
from tests.integration.s3_gate import S3Gate
from tests.integration.test_cli_client import tidemq
from tests.integration.test_retention_replicas import counter
from tests.s3_server import S3Archive
from tests.waiting import wait_until
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.errors import detail_from_metadata
from tidemq.storage.archive.backends import open_backend
from tidemq.storage.archive.format import MANIFEST_PREFIX
from tidemq.storage.archive.reader import ArchiveReader
from tidemq.storage.archive.segments import verify_segment

pytestmark = pytest.mark.integration

# Every pass deletes files older than a second, if they are archived.
BY_AGE = {
    "commitlog_file_size_bytes": 64 * 1024,
    "consume_queue_entries_per_file": 200,
    "index_slot_num": 1000,
    "index_max_num": 4000,
    "clean_resource_interval_ms": 200,
    "file_reserved_time_hours": 1 / 3600,
    "delete_when_hours": list(range(24)),
}


@pytest.fixture
def gate(s3_archive: S3Archive) -> Iterator[S3Gate]:
    g = S3Gate(s3_archive.endpoint_url)
    g.open()
    yield g
    g.release()
    g.close()


def topic_request(topic: str, attributes: dict[str, str]) -> broker_pb2.CreateTopicRequest:
    return broker_pb2.CreateTopicRequest(
        topic=common_pb2.TopicConfig(
            topic=topic, read_queue_nums=QUEUES, write_queue_nums=QUEUES, perm=6,
            attributes=attributes,
        )
    )  # fmt: skip


def start_archiving(
    start_broker: StartBroker,
    ns: NameServerProcess,
    s3: S3Archive,
    gate: S3Gate,
    metrics: str,
    *flags: str,
) -> BrokerProcess:
    return replicas.start(
        start_broker,
        ns,
        "master",
        "--archive-uri",
        s3.uri,
        "--archive-s3-endpoint",
        gate.endpoint_url,
        "--archive-interval-ms",
        "200",
        "--archive-chunk-bytes",
        "8192",
        "--metrics-listen",
        metrics,
        *flags,
        overrides=json.dumps(BY_AGE),
    )


def pull_all(b: BrokerProcess, queue_id: int) -> list[tuple[int, str, bytes]]:
    """One queue from offset 0, as (queue offset, message id, body): past local retention the
    broker reads the archive."""
    got: list[tuple[int, str, bytes]] = []
    offset = 0
    while True:
        r = b.stub().PullMessage(
            broker_pb2.PullMessageRequest(
                group="g", topic="orders", queue_id=queue_id, offset=offset, max_messages=64
            ),
            timeout=30,
        )
        got += [(m.queue_offset, m.msg_id, m.body) for m in r.messages]
        if not r.messages and r.next_offset <= offset:
            return got
        offset = r.next_offset


def bodies_by_queue(b: BrokerProcess) -> list[list[bytes]]:
    return [[body for _q, _id, body in pull_all(b, q)] for q in range(QUEUES)]


def body(prefix: str, i: int) -> bytes:
    return f"{prefix}-{i}-".encode().ljust(1000, b".")  # about 60 messages per file


def send(b: BrokerProcess, prefix: str, count: int, topic: str = "orders") -> None:
    for start_at in range(0, count, 100):
        msgs = [
            common_pb2.Message(topic=topic, body=body(prefix, i), queue_id=i % QUEUES)
            for i in range(start_at, min(count, start_at + 100))
        ]
        r = b.stub().SendMessage(broker_pb2.SendMessageRequest(messages=msgs), timeout=30)
        assert {x.status for x in r.results} == {broker_pb2.SEND_OK}


def sent_bodies(prefix: str, count: int) -> list[list[bytes]]:
    """What ``send(b, prefix, count)`` puts in each queue, in order."""
    out: list[list[bytes]] = [[] for _ in range(QUEUES)]
    for i in range(count):
        out[i % QUEUES].append(body(prefix, i))
    return out


def manifest_names(s3: S3Archive) -> list[str]:
    client = boto3.client("s3", endpoint_url=s3.endpoint_url, region_name="us-east-1")
    pages = client.get_paginator("list_objects_v2").paginate(
        Bucket=s3.bucket, Prefix=f"{s3.prefix}/{MANIFEST_PREFIX}"
    )
    return [o["Key"] for p in pages for o in p.get("Contents", [])]


def min_offset(b: BrokerProcess) -> int:
    return int(status(b).store.commitlog_min_offset)


def test_expired_files_are_archived_then_deleted_and_pulls_read_them_back(
    nameserver: NameServerProcess, start_broker: StartBroker, s3_archive: S3Archive, gate: S3Gate
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    master = start_archiving(start_broker, nameserver, s3_archive, gate, metrics)
    create_topic(master)
    send(master, "a", 600)  # about 10 files
    before = [pull_all(master, q) for q in range(QUEUES)]
    assert [[b for _q, _id, b in qs] for qs in before] == sent_bodies("a", 600)
    wait_until(lambda: min_offset(master) > 5 * 64 * 1024, 60, "retention past 5 archived files")
    assert counter(metrics, "tidemq_archive_files_total", outcome="archived") >= 5
    assert counter(metrics, "tidemq_archive_up") == 1
    # Past local retention, the same offsets, ids and bytes.
    after = [pull_all(master, q) for q in range(QUEUES)]
    assert after == before
    # A consumer group starting at the first offset gets every message, the archived ones too.
    got = tidemq(
        nameserver.address, "consume", "orders", "--group", "late-readers", "--from", "first",
        "--max", "600", "--timeout", "10", "--json",
    )  # fmt: skip
    bodies = sorted(json.loads(line)["body"].encode() for line in got.stdout.splitlines())
    assert bodies == sorted(b for q in sent_bodies("a", 600) for b in q)
    assert counter(metrics, "tidemq_archive_read_chunks_total", source="archive") > 0
    # The archive checks out on its own: every file's chunks, checksum and records.
    reader = ArchiveReader(
        open_backend(s3_archive.uri, s3_archive.endpoint_url), cache_bytes=1 << 20, record_crc=True
    )
    reader.refresh()
    entries = [e for e in reader.entries() if e.archived]
    assert entries and entries[0].base_offset == 0
    for e in entries:
        verify_segment(reader.backend, e, record_crc=True)


def test_a_broker_killed_mid_upload_resumes_without_loss_or_duplicates(
    nameserver: NameServerProcess, start_broker: StartBroker, s3_archive: S3Archive, gate: S3Gate
) -> None:
    gate.hold_chunk_uploads_after(3)
    metrics = f"127.0.0.1:{free_port()}"
    master = start_archiving(start_broker, nameserver, s3_archive, gate, metrics)
    create_topic(master)
    send(master, "k", 300)
    assert gate.holding.wait(60), "the broker never started uploading"
    master.proc.kill()  # SIGKILL, mid-upload: 3 chunks of the first file are in the bucket
    master.proc.wait(10)
    assert manifest_names(s3_archive) == []  # no entry for a file not all there
    gate.release()
    restarted = start_archiving(start_broker, nameserver, s3_archive, gate, metrics)
    wait_until(lambda: min_offset(restarted) > 0, 60, "retention after the resumed upload")
    assert counter(metrics, "tidemq_archive_chunks_reused_total") >= 3
    names = manifest_names(s3_archive)
    assert len(names) == len(set(names)) and names[0].endswith(f"{0:020d}.json")
    got = bodies_by_queue(restarted)
    assert got == sent_bodies("k", 300)


def test_an_unreachable_archive_stops_deletion_and_says_so(
    nameserver: NameServerProcess, start_broker: StartBroker, s3_archive: S3Archive, gate: S3Gate
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    master = start_archiving(start_broker, nameserver, s3_archive, gate, metrics)
    create_topic(master)
    gate.close()  # before anything is archived
    send(master, "u", 400)
    wait_until(lambda: counter(metrics, "tidemq_archive_up") == 0, 60, "archive_up to drop")
    wait_until(
        lambda: counter(metrics, "tidemq_retention_files_kept_total", reason="unarchived") >= 1,
        30,
        "retention to hold an unarchived file",
    )
    assert counter(metrics, "tidemq_archive_pending_files") >= 5
    assert min_offset(master) == 0  # expired, unarchived: nothing deleted
    gate.open()  # back
    wait_until(lambda: min_offset(master) > 0, 60, "deletion once the archive is back")
    assert counter(metrics, "tidemq_archive_up") == 1
    got = bodies_by_queue(master)
    assert got == sent_bodies("u", 400)


def test_a_corrupted_archived_object_is_refused_never_served(
    nameserver: NameServerProcess, start_broker: StartBroker, s3_archive: S3Archive, gate: S3Gate
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    master = start_archiving(start_broker, nameserver, s3_archive, gate, metrics)
    create_topic(master)
    send(master, "c", 400)
    wait_until(lambda: min_offset(master) > 64 * 1024, 60, "the first file archived and deleted")
    client = boto3.client("s3", endpoint_url=s3_archive.endpoint_url, region_name="us-east-1")
    key = f"{s3_archive.prefix}/segments/{0:020d}/chunk-000000"
    raw = bytearray(client.get_object(Bucket=s3_archive.bucket, Key=key)["Body"].read())
    raw[len(raw) // 2] ^= 0xFF
    client.put_object(Bucket=s3_archive.bucket, Key=key, Body=bytes(raw))
    with pytest.raises(grpc.RpcError) as e:
        master.stub().PullMessage(
            broker_pb2.PullMessageRequest(group="g", topic="orders", queue_id=0, offset=0),
            timeout=30,
        )
    assert e.value.code() == grpc.StatusCode.DATA_LOSS
    detail = detail_from_metadata(e.value.trailing_metadata())
    assert detail is not None and detail.code == common_pb2.CORRUPT_RECORD
    assert "checksum" in detail.message and "chunk-000000" in detail.message
    assert counter(metrics, "tidemq_archive_corrupt_objects_total") >= 1
    # What is still local reads as before: queue 0's last message (offset 99 of 100).
    local = master.stub().PullMessage(
        broker_pb2.PullMessageRequest(group="g", topic="orders", queue_id=0, offset=99),
        timeout=30,
    )
    assert [m.body for m in local.messages] == [sent_bodies("c", 400)[0][99]]


def test_a_topics_retention_policy_decides_what_is_archived(
    nameserver: NameServerProcess, start_broker: StartBroker, s3_archive: S3Archive, gate: S3Gate
) -> None:
    metrics = f"127.0.0.1:{free_port()}"
    master = start_archiving(
        start_broker, nameserver, s3_archive, gate, metrics, "--archive-default-policy", "delete"
    )
    stub = master.stub()
    with pytest.raises(grpc.RpcError) as e:
        stub.CreateTopic(topic_request("bad", {"retention.policy": "forever"}), timeout=10)
    assert e.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "retention.policy" in (e.value.details() or "")
    stub.CreateTopic(topic_request("orders", {"retention.policy": "archive"}), timeout=10)
    stub.CreateTopic(topic_request("scratch", {}), timeout=10)
    send(master, "s", 400, topic="scratch")  # files of scratch only: recorded, not uploaded
    send(master, "k", 100)
    send(master, "s", 400, topic="scratch")
    wait_until(lambda: min_offset(master) > 10 * 64 * 1024, 60, "retention past 10 files")
    assert counter(metrics, "tidemq_archive_files_total", outcome="skipped") >= 5
    assert counter(metrics, "tidemq_archive_files_total", outcome="archived") >= 1
    got = bodies_by_queue(master)
    assert got == sent_bodies("k", 100)  # all of it, from the archive


def test_a_slave_follows_its_masters_manifest_and_reads_the_archive(
    nameserver: NameServerProcess, start_broker: StartBroker, s3_archive: S3Archive, gate: S3Gate
) -> None:
    master_metrics, slave_metrics = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
    master = start_archiving(start_broker, nameserver, s3_archive, gate, master_metrics)
    create_topic(master)
    slave = replicas.start(
        start_broker,
        nameserver,
        "slave",
        *replicas.SLAVE_FLAGS,
        "--archive-uri",
        s3_archive.uri,
        "--archive-s3-endpoint",
        gate.endpoint_url,
        "--archive-interval-ms",
        "200",
        "--metrics-listen",
        slave_metrics,
        overrides=json.dumps(BY_AGE),
    )
    wait_until(lambda: "orders" in replicas.topic_names(slave), 30, "the slave to learn 'orders'")
    send(master, "r", 600)
    wait_until(lambda: min_offset(slave) > 5 * 64 * 1024, 60, "the slave's retention")
    # Only the master uploads; the slave deleted what the master's manifest lists.
    assert counter(slave_metrics, "tidemq_archive_files_total", outcome="archived") == 0
    assert counter(master_metrics, "tidemq_archive_files_total", outcome="archived") >= 5
    got = bodies_by_queue(slave)
    assert got == sent_bodies("r", 600)
