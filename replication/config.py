"""Replication settings, validated once at construction; every name carries its unit."""

from __future__ import annotations

import enum
from dataclasses import dataclass

from tidemq.storage.errors import ConfigError

# Slaves accept messages up to this size (plus framing), whatever their own settings say.
MAX_CHUNK_BYTES = 32 * 1024 * 1024


class SlaveFlush(enum.Enum):
    """When a slave acknowledges replicated bytes (docs/replication.md says what each promises)."""

    # Once appended (in the page cache): survives a kill of the slave process, not power loss.
    ASYNC = "async"
    # Once fsynced: with a SYNC_MASTER on sync flush, survives power loss of both machines.
    SYNC = "sync"


@dataclass(frozen=True)
class ReplicationConfig:
    # Largest chunk the master sends (RocketMQ's haTransferBatchSize is 32 KiB). Each chunk costs
    # a fixed few milliseconds of event-loop and GIL hand-offs on both sides, so catch-up speed
    # grows with it: about 70 MB/s at 256 KiB, 150-200 at 1 MiB, 270-690 at 4 MiB (here, 2 cores).
    # A live stream sends what is new, so small sends still leave at once in small chunks.
    chunk_bytes: int = 4 * 1024 * 1024
    # Bytes sent but not yet acknowledged per slave: bounds what sits in gRPC buffers.
    max_in_flight_bytes: int = 16 * 1024 * 1024
    # The slave reports after every chunk and at least this often.
    report_interval_ms: int = 5_000
    # The master sends a heartbeat when it has sent nothing for this long.
    heartbeat_interval_ms: int = 5_000
    # Either side drops a link it has heard nothing on for this long.
    idle_timeout_ms: int = 20_000
    # How often an idle master looks for new CommitLog bytes.
    poll_interval_ms: int = 10
    # Reconnect backoff of the slave: exponential from the first value, capped at the second.
    reconnect_min_ms: int = 200
    reconnect_max_ms: int = 5_000
    # SYNC_MASTER: a send is acknowledged once this many slaves hold it (RocketMQ: 1 slave).
    min_insync_replicas: int = 1
    # SYNC_MASTER: how long a send waits for its acknowledgements before FLUSH_SLAVE_TIMEOUT.
    sync_timeout_ms: int = 3_000
    # A slave further behind than this is out of sync: it neither acknowledges SYNC sends nor
    # holds back the confirm offset (RocketMQ's haMaxGapNotInSync).
    insync_max_lag_bytes: int = 256 * 1024 * 1024
    # How often the master logs every slave's lag.
    lag_report_interval_ms: int = 60_000
    # Consumers of a master see only what min_insync_replicas in-sync slaves hold, so a failover
    # cannot take back a message a consumer has seen.
    confirm_offset: bool = False
    # When a slave acknowledges what it received: async (appended) or sync (fsynced). A string
    # from TOML or a flag is accepted and turned into the enum.
    slave_flush: SlaveFlush = SlaveFlush.ASYNC
    # While a slave is more than this far behind its master (catching up: a new slave, one back
    # from an outage), its store warms this far ahead of its writes (``MessageStore.
    # set_warm_ahead``): the first touch of each new page moves off the appending thread onto
    # the core the catch-up leaves idle (2-6 times faster catch-up on the development VM). In
    # step with its master it does not: there warming only added CPU per message. 0: never.
    catch_up_warm_bytes: int = 64 * 1024 * 1024

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.slave_flush, SlaveFlush):
            try:
                flush = SlaveFlush(str(self.slave_flush).lower())
            except ValueError:
                problems.append(f"slave_flush must be 'async' or 'sync', not {self.slave_flush!r}")
            else:
                object.__setattr__(self, "slave_flush", flush)  # frozen: set once, here
        problems += [
            f"{name} must be > 0"
            for name in (
                "chunk_bytes",
                "max_in_flight_bytes",
                "report_interval_ms",
                "heartbeat_interval_ms",
                "idle_timeout_ms",
                "poll_interval_ms",
                "reconnect_min_ms",
                "reconnect_max_ms",
                "min_insync_replicas",
                "sync_timeout_ms",
                "insync_max_lag_bytes",
                "lag_report_interval_ms",
            )
            if getattr(self, name) <= 0
        ]
        if self.catch_up_warm_bytes < 0:
            problems.append("catch_up_warm_bytes must be >= 0")
        if self.chunk_bytes > MAX_CHUNK_BYTES:
            problems.append(f"chunk_bytes must be <= {MAX_CHUNK_BYTES}")
        if self.max_in_flight_bytes < self.chunk_bytes:
            problems.append("max_in_flight_bytes must be >= chunk_bytes")
        # A link must carry traffic well inside the idle timeout, or healthy links get dropped.
        for name in ("report_interval_ms", "heartbeat_interval_ms"):
            if getattr(self, name) * 2 > self.idle_timeout_ms:
                problems.append(f"{name} must be at most half of idle_timeout_ms")
        if self.reconnect_min_ms > self.reconnect_max_ms:
            problems.append("reconnect_min_ms must be <= reconnect_max_ms")
        if problems:
            raise ConfigError("invalid replication config: " + "; ".join(problems))
