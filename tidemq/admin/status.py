"""The shape of ``Admin.cluster_status`` (JSON-friendly): pure functions of the nameserver's
and the brokers' answers, so the CLI's ``cluster status`` and scripts read one format."""

from __future__ import annotations

from typing import Any

from tidemq.protos import common_pb2


def nameserver_json(status: Any) -> dict[str, Any]:
    """The nameserver's GetStatus answer: its registry, and whether its routes are stale."""
    return {
        "registry": status.registry,
        "stale": status.stale,
        "brokers": status.brokers,
    }


def broker_json(live: Any) -> dict[str, Any]:
    """A broker as the nameserver knows it (a LiveBroker of the cluster info)."""
    b = live.broker
    return {
        "broker_name": b.identity.broker_name,
        "broker_id": b.identity.broker_id,
        "address": b.address,
        "role": _role_name(b.role),
        "epoch": b.epoch,
        "topics": live.topics,
        "last_update_ms": live.last_update_ms,
    }


def broker_status_json(st: Any) -> dict[str, Any]:
    """A broker's own GetBrokerStatus answer: its store, replication and failover figures."""
    out: dict[str, Any] = {
        "store": {
            "commitlog_min_offset": st.store.commitlog_min_offset,
            "commitlog_max_offset": st.store.commitlog_max_offset,
            "flushed_offset": st.store.flushed_offset,
            "dispatched_offset": st.store.dispatched_offset,
            "disk_usage_ratio": round(st.store.disk_usage_ratio, 4),
            "writable": st.store.writable,
        },
        "replication": _replication_json(st.replication),
    }
    if st.failover.mode == "auto":
        out["failover"] = _failover_json(st.failover)
    if st.daily:
        out["daily"] = [
            {
                "day": d.day,
                "topic": d.topic,
                "messages_in": d.messages_in,
                "messages_out": d.messages_out,
            }
            for d in st.daily
        ]
    return out


def _failover_json(f: Any) -> dict[str, Any]:
    """A broker's view of its group under automatic failover."""
    return {
        "group_epoch": f.group_epoch,
        "master_id": f.master_id,
        "isr": list(f.isr),
        "role": f.role,
        "local_epoch": f.local_epoch,
        "acknowledging": f.acknowledging,
        "priority": f.priority,
        "waiting_reason": f.waiting_reason,
    }


def _replication_json(rs: Any) -> dict[str, Any]:
    """A broker's replication status: its slaves' lag (a master) or its link (a slave)."""
    out: dict[str, Any] = {
        "confirm_offset_enabled": rs.confirm_offset_enabled,
        "confirmed_offset": rs.confirmed_offset,
        "min_insync_replicas": rs.min_insync_replicas,
        "slaves": [
            {
                "broker_id": s.broker_id,
                "address": s.address,
                "acked_offset": s.acked_offset,
                "lag_bytes": s.lag_bytes,
                "lag_seconds": round(s.lag_seconds, 3),
                "in_sync": s.in_sync,
                "connected_for_ms": s.connected_for_ms,
            }
            for s in rs.slaves
        ],
    }
    if rs.master_address:
        out["master"] = {
            "address": rs.master_address,
            "connected": rs.connected,
            "master_max_offset": rs.master_max_offset,
            "lag_bytes": rs.lag_bytes,
            "last_config_sync_ms": rs.last_config_sync_ms,
        }
    return out


def _role_name(role: int) -> str:
    """The role's name in the generated enum; UNKNOWN for none (0) or a number it lacks."""
    if role == common_pb2.BROKER_ROLE_UNSPECIFIED or role not in common_pb2.BrokerRole.values():
        return "UNKNOWN"
    name: str = common_pb2.BrokerRole.Name(role)
    return name
