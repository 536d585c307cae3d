"""Store configuration: one frozen dataclass, validated once at construction, units in names.

Defaults are RocketMQ's (spec §7). Sizes are configuration so tests can use tiny files and see
rolls, blanks and retention within a few messages.
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from tidemq.storage.errors import ConfigError

if TYPE_CHECKING:
    from tidemq.storage.archive.config import ArchiveConfig

COMMITLOG_MIN_FILE_SIZE_BYTES = 1024


class FlushMode(enum.Enum):
    ASYNC = "ASYNC"
    SYNC = "SYNC"


def parse_host(host: str) -> tuple[bytes, int]:
    """``"127.0.0.1:10911"`` or ``"[::1]:10911"`` -> (packed address, port)."""
    addr, sep, port_s = host.rpartition(":")
    if not sep:
        raise ConfigError(f"host {host!r} must be ADDRESS:PORT")
    addr = addr.strip("[]")
    try:
        ip = ipaddress.ip_address(addr)
        port = int(port_s)
    except ValueError as e:
        raise ConfigError(f"host {host!r}: {e}") from None
    if not 0 <= port <= 65535:
        raise ConfigError(f"host {host!r}: port out of range")
    return ip.packed, port


@dataclass(frozen=True)
class StoreConfig:
    root_dir: str
    # Layout: fixed at store creation (recorded in store.json); reopening with others is refused.
    commitlog_file_size_bytes: int = 1 << 30
    consume_queue_entries_per_file: int = 300_000
    index_slot_num: int = 5_000_000
    index_max_num: int = 20_000_000
    message_index_enable: bool = True
    # Every record carries RocketMQ's whole-record CRC property (20 bytes, spec §1.2), so damage
    # anywhere in a record is caught, not only in its body. RocketMQ's default is off. Part of the
    # layout: fixed at creation, and master and slaves must agree.
    record_crc: bool = True
    # Limits.
    max_message_body_bytes: int = 4 << 20
    # Flush.
    flush_mode: FlushMode = FlushMode.ASYNC
    flush_interval_ms: int = 500
    flush_least_pages: int = 4
    flush_thorough_interval_ms: int = 10_000
    sync_flush_timeout_ms: int = 5_000
    consume_queue_flush_interval_ms: int = 1_000
    # ConsumeQueue files mapped at once at most (docs/storage.md, "Many queues"): past it the
    # least recently used queues are unmapped, and mapped again when next used. Each mapped file
    # holds two descriptors and one mapping: keep 2 x this under the descriptor limit
    # (ulimit -n) with room for the CommitLog, the index and the broker's sockets, and under
    # vm.max_map_count (65530 by default).
    consume_queue_max_open_files: int = 4096
    checkpoint_interval_ms: int = 1_000
    # Pages (storage.warm, storage.pages, storage.transient_pool; docs/storage.md "Pages").
    # How far ahead of the CommitLog's write position a background thread keeps pages in the
    # page cache, so writers do not pay first-touch faults (storage.warm). 0 (the default) turns
    # it off: appends go through pwrite, which allocates a page as it copies into it, and
    # populating pages ahead allocates and zeroes them first, in a thread of the same process:
    # on the development VM a broker spent 1.4-2 us more CPU per 1 KiB message with 64 MiB of
    # warming and its writer saved nothing measurable (docs/storage.md, "Pages").
    warm_ahead_bytes: int = 0
    # RocketMQ's warmMappedFileEnable: populate a new CommitLog file whole (one madvise) as it
    # is created. The store has no allocation thread: files are created by the writer under the
    # put lock, so this pauses puts at every roll for as long as the populate takes.
    warm_mapped_file: bool = False
    # mlock the CommitLog file being written (its pages stay in memory), munlock it when the
    # writer moves to the next. Needs RLIMIT_MEMLOCK >= the file size or CAP_IPC_LOCK; a refusal
    # is logged once and counted (MessageStore.page_stats), never fatal. Locking a file faults
    # it in whole, in the writer's thread at the roll, as warm_mapped_file does.
    mlock_commitlog: bool = False
    # RocketMQ's transientStorePoolEnable (storage.transient_pool): records are appended into
    # pre-faulted, mlocked memory buffers, one per CommitLog file being written, and a commit
    # (the commitlog-commit thread, or a flush) copies them into the file with pwrite. Readers,
    # dispatch and replication see only committed bytes. A put is answered (its durable future)
    # once its bytes are committed under ASYNC flush, once they are committed and flushed under
    # SYNC, so what was acknowledged survives kill -9 exactly as without the pool (RocketMQ
    # answers an ASYNC put before the commit: uncommitted bytes die with its process).
    # RocketMQ 4.x allows the pool only on an ASYNC-flush master. Here SYNC flush is allowed:
    # its flush commits first, so a SYNC put is as durable as without the pool, the writer
    # still copies into locked memory, and the commit rides on the group commit. Slaves are
    # allowed (a slave may become master with the same settings): replicated bytes are committed
    # as they arrive, so there the pool only adds a copy. A SYNC_MASTER's slaves see a put at
    # its commit, not at its append (the replication poll, 10 ms, may be added to the wait).
    # Memory: transient_store_pool_buffers x commitlog_file_size_bytes, locked, while open.
    transient_store_pool_enable: bool = False
    # RocketMQ's transientStorePoolSize (5). Two suffice in steady state (the file being
    # written and the one before it while its last bytes are committed).
    transient_store_pool_buffers: int = 5
    # RocketMQ's commitIntervalCommitLog (200 ms) and commitCommitLogLeastPages (4): how often
    # the commit thread commits on its own, and the fewest new pages it commits then. A put
    # waiting for its answer wakes it, and a commit with a put waiting copies everything.
    commit_interval_ms: int = 200
    commit_least_pages: int = 4
    # Identity written into every record and every offset message id.
    store_host: str = "127.0.0.1:10911"
    # Retention.
    file_reserved_time_hours: float = 72.0
    delete_when_hours: tuple[int, ...] = (4,)
    clean_resource_interval_ms: int = 10_000
    delete_file_batch_max: int = 10
    disk_max_used_space_ratio: float = 0.75
    disk_space_clean_forcibly_ratio: float = 0.85
    disk_space_warning_level_ratio: float = 0.90
    # Forced retention (above disk_space_clean_forcibly_ratio) deletes unexpired files a consumer
    # group has not read only when True; by default it keeps them and the disk fills until writes
    # are refused (storage.retention).
    force_delete_unconsumed: bool = False
    # Archive instead of (only) delete (docs/archive.md): None keeps RocketMQ's behaviour.
    archive: ArchiveConfig | None = None
    # Recovery: a bad record followed by good ones is corruption, not a torn tail. By default the
    # store refuses to open (an operator decides); True cuts there and keeps the rest as evidence.
    truncate_on_corruption: bool = False
    # Once a recovery pass has re-dispatched this much CommitLog, a helper process indexes the
    # rest on another core (storage.index_rebuild); None keeps it all in the store's process.
    recovery_index_helper_min_bytes: int | None = 64 << 20
    store_host_packed: tuple[bytes, int] = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        problems: list[str] = []
        if not self.root_dir:
            problems.append("root_dir is empty")
        if self.commitlog_file_size_bytes < COMMITLOG_MIN_FILE_SIZE_BYTES:
            problems.append(
                f"commitlog_file_size_bytes must be >= {COMMITLOG_MIN_FILE_SIZE_BYTES}, "
                f"got {self.commitlog_file_size_bytes}"
            )
        if self.consume_queue_entries_per_file < 1:
            problems.append("consume_queue_entries_per_file must be >= 1")
        if self.consume_queue_max_open_files < 1:
            problems.append("consume_queue_max_open_files must be >= 1")
        if self.index_slot_num < 1 or self.index_max_num < 2:
            problems.append("index_slot_num must be >= 1 and index_max_num >= 2")
        if self.max_message_body_bytes < 0:
            problems.append("max_message_body_bytes must be >= 0")
        for name in (
            "flush_interval_ms",
            "flush_thorough_interval_ms",
            "sync_flush_timeout_ms",
            "consume_queue_flush_interval_ms",
            "checkpoint_interval_ms",
            "clean_resource_interval_ms",
        ):
            if getattr(self, name) <= 0:
                problems.append(f"{name} must be > 0")
        if self.warm_ahead_bytes < 0:
            problems.append("warm_ahead_bytes must be >= 0")
        if self.transient_store_pool_buffers < 1:
            problems.append("transient_store_pool_buffers must be >= 1")
        if self.commit_interval_ms <= 0:
            problems.append("commit_interval_ms must be > 0")
        if self.commit_least_pages < 0:
            problems.append("commit_least_pages must be >= 0")
        if self.recovery_index_helper_min_bytes is not None and (
            self.recovery_index_helper_min_bytes < 0
        ):
            problems.append("recovery_index_helper_min_bytes must be >= 0 or None")
        if self.flush_least_pages < 0:
            problems.append("flush_least_pages must be >= 0")
        if self.file_reserved_time_hours <= 0:
            problems.append("file_reserved_time_hours must be > 0")
        if any(not 0 <= h <= 23 for h in self.delete_when_hours):
            problems.append(f"delete_when_hours must be hours 0-23, got {self.delete_when_hours}")
        if self.delete_file_batch_max < 1:
            problems.append("delete_file_batch_max must be >= 1")
        ratios = (
            self.disk_max_used_space_ratio,
            self.disk_space_clean_forcibly_ratio,
            self.disk_space_warning_level_ratio,
        )
        if not all(0.0 < r <= 1.0 for r in ratios) or list(ratios) != sorted(ratios):
            problems.append(
                "disk ratios must lie in (0, 1] with "
                "max_used <= clean_forcibly <= warning_level, got " + repr(ratios)
            )
        try:
            packed = parse_host(self.store_host)
        except ConfigError as e:
            problems.append(str(e))
            packed = (b"", 0)
        if problems:
            raise ConfigError("invalid store config: " + "; ".join(problems))
        object.__setattr__(self, "store_host_packed", packed)

    @property
    def consume_queue_file_size_bytes(self) -> int:
        return self.consume_queue_entries_per_file * 20
