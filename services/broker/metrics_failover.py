"""What a scrape reads of a broker's role and its group's automatic failover: the role it acts
in now and the epoch it knows (every broker), and, under ``--failover auto``, the elections it
took part in and how long it has seen its group without a master (``FailoverCollector``).

``tidemq_broker_info`` carries the *configured* role, which under automatic failover only says
what kind of master the broker would be; ``tidemq_broker_role`` is the role it acts in now.
"""

from __future__ import annotations

from collections.abc import Iterable

from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from tidemq.services.broker.config import BrokerRole
from tidemq.services.broker.failover import ELECTION_OUTCOMES, FailoverAgent
from tidemq.services.broker.role import RoleState
from tidemq.storage.clock import monotonic_ms


class FailoverCollector:
    """Read in the HTTP server's thread: plain attributes the event loop writes (ints, a dict
    of ints, the agent's last view), each read once per scrape."""

    def __init__(self, role: RoleState, agent: FailoverAgent | None) -> None:
        self.role = role
        self.agent = agent

    def describe(self) -> Iterable[Metric]:
        return self._families()

    def _families(self) -> list[GaugeMetricFamily | CounterMetricFamily]:
        fams: list[GaugeMetricFamily | CounterMetricFamily] = [
            GaugeMetricFamily(
                "tidemq_broker_role",
                "1 for the role this broker acts in now (ASYNC_MASTER, SYNC_MASTER or SLAVE), "
                "0 for the others; under automatic failover it moves with elections",
                labels=("role",),
            ),
            GaugeMetricFamily(
                "tidemq_broker_acknowledging_writes",
                "1 while this broker is a master that may acknowledge writes (under automatic "
                "failover: within its lease, not waiting out a predecessor's, no switchover)",
            ),
            GaugeMetricFamily(
                "tidemq_broker_epoch",
                "The broker group's epoch as this broker knows it (raised by every election; "
                "0 without automatic failover)",
            ),
            # Without automatic failover these two have no samples: no election to count, no
            # watch on the group's master. Their names stay, so queries and rules resolve.
            CounterMetricFamily(
                "tidemq_failover_elections",
                "Elections this broker took part in (it saw its group without a master), by how "
                "they ended for it: won (it took over), lost (another broker became master), "
                "take_over_failed (it won but could not take over, and let go)",
                labels=("outcome",),
            ),
            GaugeMetricFamily(
                "tidemq_failover_master_absent_seconds",
                "How long this broker has seen its group without a master (0 while one is "
                "known, and while this broker is the master)",
            ),
        ]
        return fams

    def collect(self) -> Iterable[Metric]:
        fams = self._families()
        role, acknowledging, epoch = fams[:3]
        r = self.role
        for kind in BrokerRole:
            role.add_metric([kind.value], 1 if r.role is kind else 0)
        acknowledging.add_metric([], 1 if r.may_acknowledge() else 0)
        known = r.epoch
        agent = self.agent
        if agent is not None:
            view = agent.view
            if view is not None and view.state is not None:
                # A follower may read a newer epoch before it has followed its master.
                known = max(known, view.state.epoch)
            elections, absent = fams[3:]
            counts = agent.elections.copy()
            for outcome in ELECTION_OUTCOMES:
                elections.add_metric([outcome], counts[outcome])
            absent.add_metric([], agent.masterless_s(monotonic_ms()))
        epoch.add_metric([], known)
        return fams
