"""Automatic failover's ZooKeeper calls for one broker group: read the group's znodes (leaving
watches), publish a candidate, write the state, win an election, let go of the leader, hand the
group over. Blocking kazoo calls, each with a timeout; the agent (``failover``) runs them in the
loop's default executor and makes every decision itself. Layout and format:
``failover_znodes``.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from kazoo.exceptions import BadVersionError, NoNodeError

from tidemq.replication.election import Candidate, GroupState
from tidemq.services.broker import failover_znodes as zn
from tidemq.services.broker.zk_leaf import sync_znode

log = logging.getLogger(__name__)


@dataclass
class GroupView:
    state: GroupState | None
    state_version: int
    leader: zn.Leader | None
    leader_owner: int
    candidates: list[Candidate]


class GroupZnodes:
    """One group's failover znodes, through whichever kazoo client the caller holds now."""

    def __init__(self, paths: zn.GroupPaths, timeout_s: float) -> None:
        self.paths = paths
        self.timeout_s = timeout_s

    def read(self, client: Any, with_candidates: bool, watch: Callable[[Any], None]) -> GroupView:
        t = self.timeout_s
        state, version = None, -1
        try:
            data, stat = client.get_async(self.paths.state, watch=watch).get(timeout=t)
            state, version = zn.decode_state(data), stat.version
        except NoNodeError:
            client.exists_async(self.paths.state, watch=watch).get(timeout=t)
        leader, owner = None, 0
        try:
            data, stat = client.get_async(self.paths.leader, watch=watch).get(timeout=t)
            leader, owner = zn.decode_leader(data), stat.ephemeralOwner
        except NoNodeError:
            client.exists_async(self.paths.leader, watch=watch).get(timeout=t)
        candidates: list[Candidate] = []
        if with_candidates:
            try:
                names = client.get_children_async(self.paths.candidates).get(timeout=t)
            except NoNodeError:
                names = []
            for name in names:
                try:
                    data, _ = client.get_async(f"{self.paths.candidates}/{name}").get(timeout=t)
                    candidates.append(zn.decode_candidate(name, data).candidate)
                except NoNodeError:
                    continue  # gone between the listing and the read
                except zn.FailoverZnodeError as e:
                    log.warning("ignoring a candidate: %s", e)
        return GroupView(state, version, leader, owner, candidates)

    def publish_candidate(
        self, client: Any, broker_id: int, data: bytes, watch: Callable[[Any], None]
    ) -> None:
        """Raises ZnodeHeldElsewhereError or ZnodeRaceError as ``sync_znode`` does."""
        sync_znode(client, self.paths.candidate(broker_id), data, watch, self.timeout_s)

    def set_state(self, client: Any, state: GroupState, version: int) -> None:
        client.set_async(self.paths.state, zn.encode_state(state), version=version).get(
            timeout=self.timeout_s
        )

    def elect(
        self, client: Any, old: GroupState | None, version: int, new: GroupState, leader: zn.Leader
    ) -> None:
        t = self.timeout_s
        if old is None:
            client.ensure_path_async(self.paths.base).get(timeout=t)
        tx = client.transaction()
        if old is None:
            tx.create(self.paths.state, zn.encode_state(new))
        else:
            tx.set_data(self.paths.state, zn.encode_state(new), version=version)
        tx.create(self.paths.leader, zn.encode_leader(leader), ephemeral=True)
        self._commit(tx)

    def hand_over(self, client: Any, new: GroupState, version: int) -> None:
        """Write ``new`` (which names the target ``preferred``) and delete the leader znode, in
        one transaction."""
        tx = client.transaction()
        tx.set_data(self.paths.state, zn.encode_state(new), version=version)
        tx.delete(self.paths.leader)
        self._commit(tx)

    def delete_own(self, client: Any, path: str) -> bool:
        """Delete the ephemeral znode at ``path`` if this session holds it; True if it did."""
        stat = client.exists_async(path).get(timeout=self.timeout_s)
        if stat is None or stat.ephemeralOwner != client.client_id[0]:
            return False
        with contextlib.suppress(NoNodeError, BadVersionError):
            client.delete_async(path, version=stat.version).get(timeout=self.timeout_s)
        return True

    def delete_leader(self, client: Any) -> None:
        with contextlib.suppress(NoNodeError):
            client.delete_async(self.paths.leader).get(timeout=self.timeout_s)

    def _commit(self, tx: Any) -> None:
        """kazoo's commit returns its failures instead of raising them: raise the cause."""
        results = tx.commit_async().get(timeout=self.timeout_s)
        failures = [r for r in results if isinstance(r, Exception)]
        if failures:
            # The first real failure names the cause; the others are RolledBackError.
            real = [r for r in failures if type(r).__name__ != "RolledBackError"]
            raise (real or failures)[0]
