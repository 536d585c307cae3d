"""The console producer and consumer and the operator's commands of issue 25, each a real
``tidemq`` process against a real nameserver and broker: ``send`` reading lines, ``consume``
from an offset or a time and following until Ctrl-C, ``consumer-group reset``, and
``cluster status`` with its rates."""

from __future__ import annotations

import base64
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from tests.integration.conftest import NameServerProcess, StartBroker, StartNameServer
from tests.integration.test_cli_client import tidemq
from tests.waiting import wait_until
from tidemq.consumer import Consumer
from tidemq.producer import Producer

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


def run_with_input(ns: str, stdin: str, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq.cli", *args],
        input=stdin,
        capture_output=True,
        text=True,
        env={**os.environ, "TIDEMQ_NAMESERVER": ns},
        timeout=60,
        check=False,
    )


def consumed(ns: str, group: str, *flags: str) -> list[dict[str, Any]]:
    out = tidemq(ns, "consume", TOPIC, "--group", group, "--json", "--timeout", "2", *flags)
    return [json.loads(line) for line in out.stdout.splitlines()]


def test_send_reads_lines_and_json_lines_and_names_a_bad_line(ns: str, tmp_path: Path) -> None:
    plain = run_with_input(ns, "one\ntwo\n\nthree\n", "send", TOPIC, "--tag", "t")
    assert plain.returncode == 0, plain.stderr
    assert "3 message(s) sent from lines 1-4: 3 SEND_OK" in plain.stdout
    lines = tmp_path / "in.jsonl"
    lines.write_text(
        json.dumps({"body": "j1", "keys": ["k1", "k2"], "properties": {"p": "v"}})
        + "\n"
        + json.dumps({"body_base64": base64.b64encode(b"\x00\xff").decode(), "tag": "bin"})
        + "\n"
    )
    sent = tidemq(ns, "send", TOPIC, "--file", str(lines), "--json-lines", "--json")
    results = [json.loads(x) for x in sent.stdout.splitlines()]
    assert [(r["line"], r["status"]) for r in results] == [(1, "SEND_OK"), (2, "SEND_OK")]
    got = {m["msg_id"]: m for m in consumed(ns, "reader", "--max", "5")}
    assert sorted(m["tag"] or "-" for m in got.values()) == ["-", "bin", "t", "t", "t"]
    j1 = got[results[0]["msg_id"]]
    assert (j1["body"], j1["keys"], j1["properties"]["p"]) == ("j1", ["k1", "k2"], "v")

    bad = run_with_input(ns, '{"body": "ok"}\n{"body": "ok2"}\n{"bdy": 1}\n{"body": "x"}\n',
                         "send", TOPIC, "--json-lines")  # fmt: skip
    assert bad.returncode == 2, bad.stderr
    assert "Traceback" not in bad.stderr
    assert bad.stderr.startswith("tidemq: line 3: unknown field(s) bdy"), bad.stderr
    assert "2 message(s) sent from lines 1-2" in bad.stderr
    # What was reported sent was sent, and nothing after the bad line.
    assert sorted(m["body"] for m in consumed(ns, "reader")) == ["ok", "ok2"]


def test_consume_from_an_offset_or_a_time_and_save_bodies(ns: str, tmp_path: Path) -> None:
    before = int(time.time() * 1000)
    sent = run_with_input(
        ns, "".join(f"m{i}\n" for i in range(10)), "send", TOPIC, "--message-group", "g", "--json"
    )
    [queue] = {json.loads(x)["queue_id"] for x in sent.stdout.splitlines()}
    got = consumed(ns, "replay", "--from-offset", "7", "--queue", str(queue), "--max", "3")
    assert [m["body"] for m in got] == ["m7", "m8", "m9"]
    # Committed as it went: nothing new for the group.
    assert consumed(ns, "replay", "--timeout", "1") == []
    later = int(time.time() * 1000) + 1000
    assert consumed(ns, "replay", "--from-time", str(later)) == []
    saved = tmp_path / "bodies"
    again = consumed(ns, "replay", "--from-time", str(before), "--save-bodies", str(saved))
    assert len(again) == 10
    assert (saved / again[0]["msg_id"]).read_bytes() == b"m0"
    assert {p.name for p in saved.iterdir()} == {m["msg_id"] for m in again}
    one = tmp_path / "one.bin"
    tidemq(ns, "message", "show", again[3]["msg_id"], "--save-body", str(one))
    assert one.read_bytes() == b"m3"
    usage = tidemq(ns, "consume", TOPIC, "--group", "x", "--queue", "0", check=False)
    assert usage.returncode == 2 and "--queue goes with" in usage.stderr


def test_consume_follow_commits_as_it_goes_until_ctrl_c(ns: str, tmp_path: Path) -> None:
    out, err = tmp_path / "follow.out", tmp_path / "follow.err"
    with out.open("w") as f, err.open("w") as e:
        proc = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tidemq.cli",
                "consume",
                TOPIC,
                "--group",
                "tail",
                "--follow",
                "--from",
                "last",
                "--json",
                "--timeout",
                "0.5",
            ],
            stdout=f,
            stderr=e,
            text=True,
            env={**os.environ, "TIDEMQ_NAMESERVER": ns},
        )
    try:
        # It owns its queues and has fixed where it starts: the end.
        wait_until(lambda: "following" in err.read_text(), 30, "the follower to own its queues")
        run_with_input(ns, "a\nb\nc\n", "send", TOPIC)
        wait_until(lambda: out.read_text().count("\n") >= 3, 20, "the follower to print 3")
        # Idle for four times its --timeout, a plain consume would have stopped; it must not.
        # The elapsed time is what is tested here, so it is waited for, not a condition.
        time.sleep(2)
        assert proc.poll() is None
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
    assert sorted(json.loads(x)["body"] for x in out.read_text().splitlines()[:3]) == [
        "a",
        "b",
        "c",
    ]
    described = json.loads(tidemq(ns, "consumer-group", "describe", "tail", "--json").stdout)
    # Only the queues it read from have a committed offset; each is at the end.
    assert [q["lag"] for q in described["offsets"] if q["max_offset"]] == [0] * sum(
        1 for q in described["offsets"] if q["max_offset"]
    )


def read_all(ns: str, group: str) -> int:
    """Read what the group has left, in this process (fewer CLI starts keep the test short),
    commit, and return how many."""
    with Consumer(ns, group=group, topic=TOPIC, start_from="first", auto_commit=False) as c:
        got = n = len(c.poll(max_messages=100, timeout_s=3))
        while n:
            n = len(c.poll(max_messages=100, timeout_s=1))
            got += n
        c.commit()
    return got


def test_consumer_group_reset_moves_one_queue_or_all(ns: str) -> None:
    with Producer(ns) as producer:
        sent = [producer.send(TOPIC, "x") for _ in range(6)]
    q = sent[0].queue_id
    assert read_all(ns, "billing") == 6  # commits the end of the queues it read
    moved = json.loads(
        tidemq(
            ns, "consumer-group", "reset", "billing", "--topic", TOPIC,
            "--offset", "1", "--queue", str(q), "--json",
        ).stdout
    )  # fmt: skip
    assert [(r["queue_id"], r["committed_offset"]) for r in moved["queues"]] == [(q, 1)]
    described = json.loads(tidemq(ns, "consumer-group", "describe", "billing", "--json").stdout)
    by_queue = {r["queue_id"]: r for r in described["offsets"]}
    assert by_queue[q]["lag"] == by_queue[q]["max_offset"] - 1 > 0
    assert all(r["lag"] in (0, None) for r in described["offsets"] if r["queue_id"] != q)
    assert "members" in described
    text = tidemq(ns, "consumer-group", "reset", "billing", "--topic", TOPIC, "--to", "first")
    assert "2 queue(s) moved" in text.stdout
    assert read_all(ns, "billing") == 6
    bad = tidemq(ns, "consumer-group", "reset", "billing", "--topic", TOPIC, "--to", "soon",
                 check=False)  # fmt: skip
    assert bad.returncode == 2 and "'soon' is not a time" in bad.stderr


def test_cluster_status_measures_messages_in_and_out(ns: str) -> None:
    # One queue, and a group that has a position on it before the first reading: its progress
    # between the readings is what counts as consumed.
    tidemq(ns, "topic", "create", "rated", "--queues", "1")
    tidemq(ns, "send", "rated", "first")
    read = ("consume", "rated", "--group", "rater", "--timeout", "1")
    tidemq(ns, *read)
    status = subprocess.Popen(
        [sys.executable, "-m", "tidemq.cli", "cluster", "status", "--json", "--interval", "5s"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "TIDEMQ_NAMESERVER": ns},
    )
    assert status.stderr is not None
    # Its first reading is taken once it says it is measuring.
    assert status.stderr.readline().startswith("measuring rates over 5 s")
    tidemq(ns, "send", "rated", "x", "--count", "50")
    tidemq(ns, *read)
    out, _ = status.communicate(timeout=30)
    assert status.returncode == 0
    [master] = [b for c in json.loads(out)["clusters"] for b in c["brokers"]]
    assert master["rates"]["in_per_s"] > 0 and master["rates"]["out_per_s"] > 0
    text = tidemq(ns, "cluster", "status", "--interval", "200ms").stdout
    assert " msg/s out " in text
