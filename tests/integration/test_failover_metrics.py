"""Failover series scraped from real brokers on a real ZooKeeper: the epoch, the role and the
elections a broker won move when its master is killed, and the survivor shows the group
masterless until it takes over."""

from __future__ import annotations

import pytest

from tests.integration.conftest import free_port
from tests.integration.failover import SESSION_MS, Group, group_fixture  # noqa: F401 - fixture
from tests.integration.test_broker_operations import sample, scrape
from tests.waiting import wait_until

pytestmark = pytest.mark.integration


def test_a_killed_master_is_replaced_and_the_survivor_counts_its_win_at_the_next_epoch(
    group: Group,
) -> None:
    metrics = {i: f"127.0.0.1:{free_port()}" for i in (1, 2)}
    for i in (1, 2):
        group.start(i, "--metrics-listen", metrics[i])
    first = group.master()
    group.wait_isr({1, 2})
    other = 3 - first

    master = scrape(metrics[first])
    assert sample(master, "tidemq_broker_epoch") == 1
    assert sample(master, "tidemq_broker_role", role="SYNC_MASTER") == 1
    assert sample(master, "tidemq_broker_acknowledging_writes") == 1
    assert sample(master, "tidemq_failover_elections_total", outcome="won") == 1
    assert sample(master, "tidemq_failover_master_absent_seconds") == 0
    slave = scrape(metrics[other])
    assert sample(slave, "tidemq_broker_epoch") == 1
    assert sample(slave, "tidemq_broker_role", role="SLAVE") == 1
    assert sample(slave, "tidemq_failover_elections_total", outcome="won") == 0

    group.kill(first)
    # Masterless from when the survivor sees the leader znode gone until it takes over (at
    # least the election settle time, 500 ms).
    wait_until(
        lambda: sample(scrape(metrics[other]), "tidemq_failover_master_absent_seconds") > 0,
        SESSION_MS / 1000 + 10,
        "the survivor to see its group without a master",
    )
    assert group.master(timeout_s=SESSION_MS / 1000 + 10, not_id=first) == other
    after = scrape(metrics[other])
    assert sample(after, "tidemq_broker_epoch") == 2
    assert sample(after, "tidemq_broker_role", role="SYNC_MASTER") == 1
    assert sample(after, "tidemq_failover_elections_total", outcome="won") == 1
    assert sample(after, "tidemq_failover_elections_total", outcome="take_over_failed") == 0
    assert sample(after, "tidemq_failover_master_absent_seconds") == 0
