"""Delayed sends from the shell (``tidemq send --delay``, ``tidemq delayed list|cancel``), each a
real process against a real nameserver and two broker groups, so every listing spans two
masters; and the ``tidemq dev`` banner that points at them."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any

import pytest

from tests.integration.cli_cluster import TOPIC, Cluster, now_ms, start_cluster
from tests.integration.conftest import StartBroker, StartNameServer
from tests.integration.test_cli_client import start_dev, tidemq
from tests.integration.test_cli_consumer_groups import one_line_error
from tidemq.cli.times import format_time_ms

pytestmark = pytest.mark.integration


@pytest.fixture
def cluster(start_nameserver: StartNameServer, start_broker: StartBroker) -> Cluster:
    return start_cluster(start_nameserver, start_broker, ["broker-a", "broker-b"])


def send(ns: str, *args: str) -> list[dict[str, Any]]:
    out = tidemq(ns, "send", TOPIC, *args, "--json")
    return [json.loads(line) for line in out.stdout.splitlines()]


def delayed(ns: str, *flags: str) -> dict[str, Any]:
    return dict(json.loads(tidemq(ns, "delayed", "list", "--json", *flags).stdout))


def test_delayed_sends_are_listed_soonest_first_across_broker_groups_and_cancelled(
    cluster: Cluster,
) -> None:
    ns = cluster.ns
    before = now_ms()
    later = send(ns, "in ten minutes", "--delay", "10m", "--count", "4")
    after = now_ms()
    assert {r["broker"] for r in later} == {"broker-a", "broker-b"}
    for r in later:
        assert r["status"] == "SEND_OK" and r["recall_handle"]
        assert before + 600_000 <= r["deliver_at_ms"] <= after + 600_000
    [by_level] = send(ns, "level 6 is 2 min", "--delay-level", "6")
    at_ms = now_ms() + 300_000
    [by_time] = send(ns, "at a time", "--deliver-at", format_time_ms(at_ms))
    assert by_time["deliver_at_ms"] == at_ms
    assert by_level["deliver_at_ms"] < by_time["deliver_at_ms"] < later[0]["deliver_at_ms"]

    listing = delayed(ns)
    sent = [by_level, by_time, *sorted(later, key=lambda r: r["deliver_at_ms"])]
    assert listing["total"] == 6
    got = listing["messages"]
    assert [m["deliver_at_ms"] for m in got] == sorted(m["deliver_at_ms"] for m in got)
    assert [m["recall_handle"] for m in got[:2]] == [
        by_level["recall_handle"],
        by_time["recall_handle"],
    ]
    assert {(m["msg_id"], m["recall_handle"], m["broker"], m["topic"]) for m in got} == {
        (r["msg_id"], r["recall_handle"], r["broker"], TOPIC) for r in sent
    }
    limited = delayed(ns, "--limit", "2")
    assert limited["total"] == 6 and limited["messages"] == got[:2]
    assert tidemq(ns, "delayed", "list", "--topic", "other").stdout == (
        "no pending delayed message(s) of other\n"
    )
    table = tidemq(ns, "delayed", "list")
    lines = table.stdout.splitlines()
    assert lines[0].split() == [
        *("DELIVER_AT", "TOPIC", "BROKER", "QUEUE", "MSG_ID", "TAG", "RECALL_HANDLE")
    ]
    assert lines[1].startswith(format_time_ms(by_level["deliver_at_ms"]))
    assert len(lines) == 7 and table.stderr == "6 of 6 pending delayed message(s)\n"

    # Cancel one held by each group: the admin finds the master that holds it.
    victims = [next(r for r in later if r["broker"] == name) for name in ("broker-a", "broker-b")]
    for victim in victims:
        cancelled = tidemq(ns, "delayed", "cancel", TOPIC, victim["recall_handle"])
        assert cancelled.stdout == (
            f"recalled {victim['msg_id']} of {TOPIC}: it will not be delivered\n"
        )
    left = delayed(ns)
    assert left["total"] == 4
    assert {m["msg_id"] for m in left["messages"]} == {r["msg_id"] for r in sent} - {
        v["msg_id"] for v in victims
    }


def other_group(handle: str, broker: str, other: str) -> str:
    """The handle as if another broker group (a name as long) held the message."""
    raw = base64.urlsafe_b64decode(handle + "=" * (-len(handle) % 4))
    assert len(broker) == len(other) and broker.encode() in raw
    return base64.urlsafe_b64encode(raw.replace(broker.encode(), other.encode(), 1)).decode()


def test_a_delayed_send_arrives_at_its_time_and_a_cancelled_one_never_and_bad_cancels_fail(
    cluster: Cluster,
) -> None:
    ns = cluster.ns
    # The one to cancel is due late enough that the cancels (a few commands away) come first.
    [cancelled] = send(ns, "cancelled", "--delay", "10s")
    handle = cancelled["recall_handle"]
    # Another topic's name with a good handle is refused and recalls nothing.
    wrong_topic = tidemq(ns, "delayed", "cancel", "other", handle, check=False)
    one_line_error(wrong_topic, "INVALID_ARGUMENT")
    done = tidemq(ns, "delayed", "cancel", TOPIC, handle, "--json")
    assert json.loads(done.stdout) == {
        "topic": TOPIC,
        "msg_id": cancelled["msg_id"],
        "recalled": True,
    }
    one_line_error(
        tidemq(ns, "delayed", "cancel", TOPIC, handle, check=False), "DELAYED_MESSAGE_NOT_FOUND"
    )
    bad = tidemq(ns, "delayed", "cancel", TOPIC, "not-a-handle", check=False)
    one_line_error(bad, "INVALID_ARGUMENT")
    # A handle naming a broker group that has no master (here: none at all) is retriable.
    elsewhere = other_group(handle, cancelled["broker"], "broker-z")
    orphan = tidemq(ns, "delayed", "cancel", TOPIC, elsewhere, check=False)
    one_line_error(orphan, "NOT_MASTER")
    assert "broker-z" in orphan.stderr
    [due] = send(ns, "due", "--delay", "2s")
    # Consume until well after the cancelled one's time (the idle timeout only grows with
    # each message received).
    idle_s = max(4.0, (cancelled["deliver_at_ms"] - now_ms()) / 1000 + 2)
    out = tidemq(
        ns, "consume", TOPIC, "--group", "g", "--json", "--timeout", f"{idle_s:.1f}", "--max", "10"
    )
    got = [json.loads(line) for line in out.stdout.splitlines()]
    assert [m["body"] for m in got] == ["due"]
    assert got[0]["store_timestamp_ms"] >= due["deliver_at_ms"]  # not visible before its time
    assert now_ms() > cancelled["deliver_at_ms"] + 1000
    assert delayed(ns)["total"] == 0


def test_a_delay_beyond_the_maximum_is_refused_and_nothing_is_stored(cluster: Cluster) -> None:
    ns = cluster.ns
    refused = tidemq(ns, "send", TOPIC, "too late", "--delay", "41d", check=False)
    one_line_error(refused, "DELAY_TOO_LONG")
    assert delayed(ns)["total"] == 0
    queues = json.loads(tidemq(ns, "topic", "describe", TOPIC, "--json").stdout)["queues"]
    assert sum(q["max_offset"] for q in queues) == 0


def test_the_dev_banner_shows_receive_and_the_production_commands_and_they_work(
    tmp_path: Path,
) -> None:
    dev = start_dev(tmp_path / "data", tmp_path / "dev.out")
    try:
        banner = dev.output()
        for command in (
            "tidemq receive orders --group billing",
            "tidemq send reminders 'call back' --delay 30s",
            "tidemq delayed list",
            "tidemq transactions list",
        ):
            assert command in banner, banner
        sent = tidemq(dev.nameserver, "send", "reminders", "call back", "--delay", "30s")
        assert " delayed until " in sent.stdout and " recall handle " in sent.stdout
        [row] = tidemq(dev.nameserver, "delayed", "list").stdout.splitlines()[1:]
        assert row.split()[1:3] == ["reminders", "broker-a"]
        assert tidemq(dev.nameserver, "transactions", "list").stdout == "no open transaction(s)\n"
        assert dev.stop() == 0
    finally:
        if dev.proc.poll() is None:
            dev.proc.kill()
            dev.proc.wait()
