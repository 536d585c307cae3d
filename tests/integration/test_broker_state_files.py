"""A broker on a store whose consumer offsets file and its backup are damaged refuses to start:
it exits non-zero with one line naming the file and the fix, no traceback, and nothing is reset
behind the operator's back. ``tidemq broker repair-state`` then resets the table explicitly
(keeping the bad file) or copies it from a running broker of the group."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from tests.integration.conftest import (
    SMALL_STORE,
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    free_port,
)
from tests.integration.replicas import create_topic, start, start_slave
from tests.waiting import wait_until
from tidemq.protos import broker_pb2

pytestmark = pytest.mark.integration

START_REFUSAL_TIMEOUT_S = 30.0


def commit(b: BrokerProcess, queue_id: int, offset: int) -> None:
    b.stub().CommitOffset(
        broker_pb2.CommitOffsetRequest(group="g", topic="orders", queue_id=queue_id, offset=offset),
        timeout=10,
    )


def committed(b: BrokerProcess, queue_id: int) -> int | None:
    r = b.stub().QueryConsumerOffset(
        broker_pb2.QueryConsumerOffsetRequest(group="g", topic="orders", queue_id=queue_id),
        timeout=10,
    )
    return int(r.offset) if r.found else None


def offsets_file(store: Path) -> Path:
    return store / "config" / "consumerOffset.json"


def damage(store: Path, text: str) -> None:
    offsets_file(store).write_text(text)
    Path(f"{offsets_file(store)}.bak").write_text(text[: len(text) // 2])


def tidemq(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "tidemq.cli", *args],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )


def refused_start(store: Path, *flags: str) -> str:
    """Start a broker on ``store``; it must exit non-zero by itself. Returns what it printed."""
    args = [sys.executable, "-m", "tidemq.cli", "broker", "--store", str(store)]
    args += ["--listen", f"127.0.0.1:{free_port()}", "--store-overrides", SMALL_STORE, *flags]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        out, err = proc.communicate(timeout=START_REFUSAL_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        proc.kill()
        out, err = proc.communicate()
        raise AssertionError(
            f"the broker started on a damaged {offsets_file(store).name}:\n{out}{err}"
        ) from None
    assert proc.returncode != 0, out + err
    return err


@pytest.mark.parametrize(
    ("damaged", "says"),
    [
        (
            '{"offsetTable": {"orders@g": {"0": 5}}\n',
            "not valid JSON: Expecting ',' delimiter at line 2",
        ),
        (
            '{"offsetTable": ["orders@g"]}\n',
            "wrong shape: 'offsetTable': expected an object, got list",
        ),
    ],
    ids=["unparsable", "wrong-shape"],
)
def test_a_broker_refuses_damaged_offsets_and_starts_after_repair_state_resets_them(
    start_broker: StartBroker, tmp_path: Path, damaged: str, says: str
) -> None:
    b = start_broker()
    create_topic(b)
    commit(b, 0, 5)
    assert b.terminate() == 0  # the offsets reach the file at shutdown
    store = b.store_dir
    damage(store, damaged)

    err = refused_start(store)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    (line,) = lines
    assert line.startswith(f"tidemq: CORRUPT_STATE_FILE: {offsets_file(store)}: "), line
    assert says in line
    assert f"tidemq broker repair-state --store {store}" in line and "--reset offsets" in line
    assert offsets_file(store).read_text() == damaged  # refused, not reset behind our back

    check = tidemq("broker", "repair-state", "--store", str(store))
    assert check.returncode == 1 and says in check.stdout, check.stdout + check.stderr
    repaired = tidemq("broker", "repair-state", "--store", str(store), "--reset", "offsets")
    assert repaired.returncode == 0, repaired.stdout + repaired.stderr
    kept = {p.name.split(".corrupt-")[0]: p for p in offsets_file(store).parent.glob("*.corrupt-*")}
    assert sorted(kept) == ["consumerOffset.json", "consumerOffset.json.bak"]
    assert kept["consumerOffset.json"].read_text() == damaged

    again = start_broker(store=store.name)
    assert committed(again, 0) is None  # reset: the group starts where its consumers say
    assert "orders" in {
        t.topic for t in again.stub().ListTopics(broker_pb2.ListTopicsRequest(), timeout=10).topics
    }


def test_repair_state_from_the_slave_restores_a_masters_damaged_offsets(
    start_broker: StartBroker, nameserver: NameServerProcess
) -> None:
    master = start(start_broker, nameserver, "master")
    create_topic(master)
    slave = start_slave(start_broker, nameserver)
    for q, offset in enumerate((11, 22, 33, 44)):
        commit(master, q, offset)
    wait_until(
        lambda: [committed(slave, q) for q in range(4)] == [11, 22, 33, 44],
        30,
        "the slave to hold the master's offsets (config sync)",
    )
    assert master.terminate() == 0
    damage(master.store_dir, '{"offsetTable": {"orders@g": {"0": 11, "1": ')
    assert "CORRUPT_STATE_FILE" in refused_start(master.store_dir)

    out = tidemq(
        "broker", "repair-state", "--store", str(master.store_dir), "--from-slave", slave.address
    )
    assert out.returncode == 0, out.stdout + out.stderr
    assert f"offsets: 4 taken from {slave.address}" in out.stdout
    assert list(master.store_dir.joinpath("config").glob("consumerOffset.json.corrupt-*"))

    back = start(start_broker, nameserver, "master")
    assert [committed(back, q) for q in range(4)] == [11, 22, 33, 44]
