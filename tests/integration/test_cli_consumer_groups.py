"""Receive/ack consumption and consumer groups from the shell: ``tidemq receive``,
``tidemq consumer-group``, ``tidemq dlq`` and ``tidemq broker-group``, each a real process against
a real nameserver and broker."""

from __future__ import annotations

import json
from typing import Any

import pytest

from tests.integration.conftest import NameServerProcess, StartBroker, StartNameServer
from tests.integration.test_cli_client import tidemq
from tests.waiting import wait_until

pytestmark = pytest.mark.integration

TOPIC = "orders"


@pytest.fixture
def ns(start_nameserver: StartNameServer, start_broker: StartBroker) -> str:
    nameserver: NameServerProcess = start_nameserver()
    start_broker(
        *("--nameserver", nameserver.address, "--broker-name", "broker-a"),
        "--auto-create-topics",
        store="broker-a",
    )
    address = nameserver.address
    wait_until(
        lambda: (
            tidemq(address, "topic", "create", TOPIC, "--queues", "2", check=False).returncode == 0
        ),
        30,
        "the broker to be routed and the topic created",
    )
    return address


def received(ns: str, group: str, *flags: str) -> list[dict[str, Any]]:
    out = tidemq(ns, "receive", TOPIC, "--group", group, "--json", "--timeout", "1", *flags)
    return [json.loads(line) for line in out.stdout.splitlines()]


def one_line_error(r: Any, code: str, exit_status: int = 1) -> None:
    assert r.returncode == exit_status, r.stdout + r.stderr
    assert "Traceback" not in r.stderr
    assert r.stderr.startswith(f"tidemq: {code}"), r.stderr
    assert r.stderr.count("\n") == 1, r.stderr


def test_receive_prints_and_acks_each_message_once(ns: str) -> None:
    tidemq(ns, "send", TOPIC, "hello", "--tag", "created", "--key", "o-1", "--count", "3")
    got = received(ns, "billing", "--count", "3")
    assert [(m["body"], m["tag"], m["keys"]) for m in got] == [("hello", "created", ["o-1"])] * 3
    assert {m["delivery_attempt"] for m in got} == {1}
    assert {m["outcome"] for m in got} == {"acked"}
    assert all(m["receipt_handle"] for m in got)
    # Acked: nobody in the group gets them again.
    assert received(ns, "billing") == []
    tidemq(ns, "send", TOPIC, "plain", "--message-group", "cust-1")
    line = tidemq(ns, "receive", TOPIC, "--group", "billing", "--timeout", "1")
    assert " attempt 1 acked message_group=cust-1: plain" in line.stdout
    assert "1 message(s): 1 acked" in line.stderr


def test_a_nacked_message_comes_back_with_its_next_attempt(ns: str) -> None:
    tidemq(ns, "consumer-group", "update", "retrier", "--retry-delays", "1s")
    tidemq(ns, "send", TOPIC, "flaky")
    [first] = received(ns, "retrier", "--count", "1", "--nack")
    assert (first["delivery_attempt"], first["outcome"]) == (1, "nacked")
    [again] = received(ns, "retrier", "--count", "1", "--timeout", "5")
    assert (again["msg_id"], again["delivery_attempt"], again["outcome"]) == (
        first["msg_id"],
        2,
        "acked",
    )


def test_consumer_group_update_describe_and_list_show_settings_and_in_flight(ns: str) -> None:
    group = "workers"
    updated = json.loads(
        tidemq(
            ns,
            *("consumer-group", "update", group, "--max-delivery-attempts", "5", "--fifo"),
            *("--retry-delays", "1s,2s,1m", "--json"),
        ).stdout
    )
    assert (updated["max_delivery_attempts"], updated["fifo"]) == (5, True)
    assert updated["retry_policy"]["delays_ms"] == [1000, 2000, 60_000]
    tidemq(ns, "send", TOPIC, "job", "--count", "3")
    tidemq(ns, "send", TOPIC, "step", "--message-group", "cust-1", "--count", "2")
    # Left, not acked: in flight for a minute. FIFO: the second step waits for the first.
    held = received(ns, group, "--count", "10", "--no-ack", "--invisible", "1m")
    assert [m["outcome"] for m in held] == ["left"] * 4
    assert sorted((m["body"], m["message_group"]) for m in held) == [
        *[("job", None)] * 3,
        ("step", "cust-1"),
    ]

    described = json.loads(tidemq(ns, "consumer-group", "describe", group, "--json").stdout)
    assert (described["model"], described["fifo"], described["consume_enabled"]) == (
        "receive",
        True,
        True,
    )
    queues = described["receive"]
    assert {q["topic"] for q in queues} == {TOPIC}
    assert sum(q["inflight"] for q in queues) == 4
    assert sum(q["blocked"] for q in queues) == 1
    assert sum(q["max_offset"] for q in queues) == 5
    assert sum(q["lag"] for q in queues) == 5  # nothing is done yet
    assert described["dead_letters"] == 0

    text = tidemq(ns, "consumer-group", "describe", group).stdout
    assert "model receive, fifo on, consume enabled, max delivery attempts 5" in text
    assert "retry delays: 1s 2s 1m" in text
    header = next(line for line in text.splitlines() if line.startswith("TOPIC"))
    assert header.split() == [
        *("TOPIC", "BROKER", "QUEUE", "DONE", "NEXT", "MAX"),
        *("INFLIGHT", "RETRYING", "BLOCKED", "LAG"),
    ]

    listed = json.loads(tidemq(ns, "consumer-group", "list", "--json").stdout)
    assert group in [g["group"] for g in listed]
    table = tidemq(ns, "consumer-group", "list").stdout.splitlines()
    assert table[0].split()[:3] == ["GROUP", "MODEL", "FIFO"]
    assert any(line.split()[:3] == [group, "receive", "yes"] for line in table[1:])

    tidemq(ns, "consumer-group", "delete", group)
    gone = json.loads(tidemq(ns, "consumer-group", "list", "--json").stdout)
    assert group not in [g["group"] for g in gone]


def test_dead_letters_are_listed_with_their_origin_and_resent_to_their_topic(ns: str) -> None:
    group = "payments"
    tidemq(ns, "consumer-group", "update", group, "--max-delivery-attempts", "1")
    tidemq(ns, "send", TOPIC, "poison", "--key", "p-1", "--property", "src=web")
    tidemq(ns, "send", TOPIC, "refused")
    [nacked] = received(ns, group, "--count", "1", "--nack")  # its only attempt failed
    [moved] = received(ns, group, "--count", "1", "--dead-letter", "bad payload")
    assert (nacked["outcome"], moved["outcome"]) == ("nacked", "dead-lettered")

    def dead() -> list[dict[str, Any]]:
        out = tidemq(ns, "dlq", "list", group, "--json").stdout
        return [json.loads(line) for line in out.splitlines()]

    wait_until(lambda: len(dead()) == 2, 15, "both messages in the dead-letter queue")
    by_body = {m["body"]: m for m in dead()}
    poison = by_body["poison"]
    assert poison["topic"] == f"%DLQ%{group}"
    assert (poison["origin_topic"], poison["origin_msg_id"]) == (TOPIC, nacked["msg_id"])
    assert poison["delivery_attempts"] == 1 and poison["reason"] == "max delivery attempts (1)"
    assert poison["keys"] == ["p-1"] and poison["properties"]["src"] == "web"
    assert by_body["refused"]["reason"] == "bad payload"
    table = tidemq(ns, "dlq", "list", group).stdout.splitlines()
    assert table[0].split() == ["MSG_ID", "TOPIC", "ATTEMPTS", "REASON", "BODY"]
    assert any(line.startswith(poison["msg_id"]) and "poison" in line for line in table)

    resent = json.loads(tidemq(ns, "dlq", "resend", group, poison["msg_id"], "--json").stdout)
    assert [(r["status"], r["topic"]) for r in resent] == [("SEND_OK", TOPIC)]
    # Back on its topic as a new message: the group receives it, on a first attempt.
    [back] = received(ns, group, "--count", "1", "--timeout", "5")
    assert (back["body"], back["keys"], back["delivery_attempt"]) == ("poison", ["p-1"], 1)
    assert back["msg_id"] == resent[0]["msg_id"]

    unknown = tidemq(ns, "dlq", "resend", group, "0" * 32, check=False)
    assert unknown.returncode == 1 and "Traceback" not in unknown.stderr
    assert unknown.stderr.count("\n") == 1


def test_mixing_the_two_models_and_a_disabled_group_are_one_line_errors(ns: str) -> None:
    tidemq(ns, "send", TOPIC, "m")
    received(ns, "receivers", "--count", "1")  # the first use makes it a receive group
    pulled = tidemq(ns, "consume", TOPIC, "--group", "receivers", "--timeout", "1", check=False)
    one_line_error(pulled, "CONSUME_MODEL_MISMATCH")
    assert "consumer-group update" in pulled.stderr  # it says how to change the model

    tidemq(ns, "consume", TOPIC, "--group", "pullers", "--timeout", "1")
    popped = tidemq(ns, "receive", TOPIC, "--group", "pullers", "--timeout", "1", check=False)
    one_line_error(popped, "CONSUME_MODEL_MISMATCH")
    pullers = json.loads(tidemq(ns, "consumer-group", "describe", "pullers", "--json").stdout)
    assert pullers["model"] == "offsets"
    assert sum(q["committed_offset"] or 0 for q in pullers["offsets"]) == 1  # consume committed
    # An operator switches it; then it receives.
    tidemq(ns, "consumer-group", "update", "pullers", "--model", "receive")
    assert tidemq(ns, "receive", TOPIC, "--group", "pullers", "--timeout", "1").returncode == 0

    tidemq(ns, "consumer-group", "update", "receivers", "--disable")
    paused = tidemq(ns, "receive", TOPIC, "--group", "receivers", "--timeout", "1", check=False)
    one_line_error(paused, "CONSUME_DISABLED")
    tidemq(ns, "consumer-group", "update", "receivers", "--enable")
    assert tidemq(ns, "receive", TOPIC, "--group", "receivers", "--timeout", "1").returncode == 0


def test_bad_input_gets_one_line_and_changes_nothing(ns: str) -> None:
    tidemq(ns, "consumer-group", "update", "g", "--no-fifo")
    zero = tidemq(ns, "receive", TOPIC, "--group", "g", "--invisible", "0s", check=False)
    one_line_error(zero, "'0s'", exit_status=2)
    too_long = tidemq(ns, "receive", TOPIC, "--group", "g", "--invisible", "30h", check=False)
    one_line_error(too_long, "INVALID_ARGUMENT")
    attempts = tidemq(
        ns, "consumer-group", "update", "g", "--max-delivery-attempts", "0", check=False
    )
    one_line_error(attempts, "INVALID_ARGUMENT")
    nothing = tidemq(ns, "consumer-group", "update", "g", check=False)
    one_line_error(nothing, "nothing to change", exit_status=2)
    both = tidemq(ns, "dlq", "resend", "g", "abc", "--all", check=False)
    one_line_error(both, "give the message ids", exit_status=2)
    settings = json.loads(tidemq(ns, "consumer-group", "describe", "g", "--json").stdout)
    assert settings["max_delivery_attempts"] == 16  # the refused update changed nothing


def test_broker_group_replaces_group_which_still_works_with_a_note(ns: str) -> None:
    new = tidemq(ns, "broker-group", "switchover", "broker-a", "--to", "1", check=False)
    # A classic broker refuses a switchover: the command reached it and says why, in one line.
    one_line_error(new, "INVALID_ARGUMENT")
    assert "classic master/slave" in new.stderr
    old = tidemq(ns, "group", "switchover", "broker-a", "--to", "1", check=False)
    note, error = old.stderr.splitlines()
    assert "deprecated" in note and "tidemq broker-group" in note
    assert error == new.stderr.rstrip("\n")
    assert old.returncode == 1
