"""Automatic failover's znodes: layout and format. Pure, so the rules are unit-tested without a
server; ``tidemq.services.broker.failover`` reads and writes them.

Layout, per broker group::

    <root>/failover/<cluster>/<broker_name>/state             persistent
    <root>/failover/<cluster>/<broker_name>/leader            ephemeral, the master's session
    <root>/failover/<cluster>/<broker_name>/candidates/<id>   ephemeral, each broker's session

- ``state``: ``{"format": 1, "epoch": 3, "master": 2, "isr": [1, 2], "preferred": null}``.
  Written only with a version check: by the winner of an election (in one transaction with the
  creation of ``leader``), and by the master of its epoch (ISR changes, a switchover's
  ``preferred``). ``isr`` is sorted and holds the master.
- ``leader``: ``{"format": 1, "broker_id": 2, "epoch": 3, "address": "h:p"}``. Exists exactly
  while the master's session lives: its disappearance is what starts an election.
- ``candidates/<id>``: ``{"format": 1, "broker_id": 2, "last_epoch": 3, "max_offset": 1024,
  "priority": 0, "address": "h:p"}``: what the election ranks a live broker by.

JSON in UTF-8, keys sorted, no whitespace. Readers refuse another ``format`` and ignore keys
they do not know.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from tidemq.replication.election import Candidate, GroupState

FORMAT = 1


class FailoverZnodeError(ValueError):
    """A failover znode this reader cannot trust."""


@dataclass(frozen=True, slots=True)
class GroupPaths:
    base: str

    @classmethod
    def of(cls, root: str, cluster: str, broker_name: str) -> GroupPaths:
        return cls(f"{root.rstrip('/')}/failover/{cluster}/{broker_name}")

    @property
    def state(self) -> str:
        return f"{self.base}/state"

    @property
    def leader(self) -> str:
        return f"{self.base}/leader"

    @property
    def candidates(self) -> str:
        return f"{self.base}/candidates"

    def candidate(self, broker_id: int) -> str:
        return f"{self.candidates}/{broker_id}"


@dataclass(frozen=True, slots=True)
class Leader:
    broker_id: int
    epoch: int
    address: str


@dataclass(frozen=True, slots=True)
class CandidateNode:
    candidate: Candidate
    address: str


def _dump(doc: dict[str, Any]) -> bytes:
    return json.dumps({"format": FORMAT, **doc}, sort_keys=True, separators=(",", ":")).encode()


def _load(data: bytes, what: str) -> dict[str, Any]:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, ValueError) as e:
        raise FailoverZnodeError(f"{what}: not JSON ({e})") from None
    if not isinstance(doc, dict):
        raise FailoverZnodeError(f"{what}: not a JSON object")
    if doc.get("format") != FORMAT:
        raise FailoverZnodeError(f"{what}: format {doc.get('format')!r}, this reader knows 1")
    return doc


def _int(doc: dict[str, Any], key: str, what: str, minimum: int = 0) -> int:
    v = doc.get(key)
    if type(v) is not int or v < minimum:
        raise FailoverZnodeError(f"{what}: {key} must be an integer >= {minimum}, got {v!r}")
    return v


def encode_state(s: GroupState) -> bytes:
    return _dump(
        {"epoch": s.epoch, "master": s.master_id, "isr": sorted(s.isr), "preferred": s.preferred}
    )


def decode_state(data: bytes) -> GroupState:
    doc = _load(data, "state")
    isr = doc.get("isr")
    if not isinstance(isr, list) or any(type(m) is not int or m < 0 for m in isr):
        raise FailoverZnodeError(f"state: isr must be a list of broker ids, got {isr!r}")
    preferred = doc.get("preferred")
    if preferred is not None and (type(preferred) is not int or preferred < 0):
        raise FailoverZnodeError(f"state: preferred must be a broker id or null, got {preferred!r}")
    s = GroupState(
        _int(doc, "epoch", "state", 1), _int(doc, "master", "state"), frozenset(isr), preferred
    )
    if s.master_id not in s.isr:
        raise FailoverZnodeError(f"state: the master {s.master_id} is not in its isr {isr}")
    return s


def encode_leader(leader: Leader) -> bytes:
    return _dump({"broker_id": leader.broker_id, "epoch": leader.epoch, "address": leader.address})


def decode_leader(data: bytes) -> Leader:
    doc = _load(data, "leader")
    address = doc.get("address")
    if not isinstance(address, str) or not address:
        raise FailoverZnodeError(f"leader: address must be host:port, got {address!r}")
    return Leader(_int(doc, "broker_id", "leader"), _int(doc, "epoch", "leader", 1), address)


def encode_candidate(node: CandidateNode) -> bytes:
    c = node.candidate
    return _dump(
        {
            "broker_id": c.broker_id,
            "last_epoch": c.last_epoch,
            "max_offset": c.max_offset,
            "priority": c.priority,
            "address": node.address,
        }
    )


def decode_candidate(name: str, data: bytes) -> CandidateNode:
    what = f"candidate {name}"
    doc = _load(data, what)
    broker_id = _int(doc, "broker_id", what)
    if str(broker_id) != name:
        raise FailoverZnodeError(f"{what}: holds broker id {broker_id}")
    priority = doc.get("priority")
    if type(priority) is not int:
        raise FailoverZnodeError(f"{what}: priority must be an integer, got {priority!r}")
    address = doc.get("address")
    if not isinstance(address, str):
        raise FailoverZnodeError(f"{what}: address must be a string")
    return CandidateNode(
        Candidate(
            broker_id, _int(doc, "last_epoch", what), _int(doc, "max_offset", what), priority
        ),
        address,
    )
