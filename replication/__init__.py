"""Replication: a slave streams its master's CommitLog and rebuilds its own indexes from it.

Layers, as etcd raft keeps its progress tracker apart from the network: ``master`` and ``slave``
are the pure state machines (no sockets, no clocks: callers pass ``now_ms``), ``log`` is what they
know of a CommitLog (and the probes a slave sends to prove where it stands), ``master_link`` and
``slave_link`` are the two ends of the thin grpc.aio transport. Imports ``storage``, and the
generated ``protos`` only in the transport, never ``services``.
"""

from tidemq.replication.config import ReplicationConfig, SlaveFlush
from tidemq.replication.handshake import Accept, Identity, Refusal, RefusalKind
from tidemq.replication.master import MasterTracker
from tidemq.replication.slave import SlaveSession

__all__ = [
    "Accept",
    "Identity",
    "MasterTracker",
    "Refusal",
    "RefusalKind",
    "ReplicationConfig",
    "SlaveFlush",
    "SlaveSession",
]
