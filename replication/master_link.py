"""The master's end of a replication link: the ``Replication`` gRPC service (grpc.aio).

One ``Stream`` call per slave. It reads the slave's Handshake, lets ``handshake.py`` decide
(accept from an offset, truncate, or refuse), then a reader task applies the slave's reports
to the tracker while the handler asks the tracker what to do next (send a chunk read with
``read_raw``, send a heartbeat, wait, drop) and yields it. gRPC's own flow control and the
tracker's in-flight bound keep a slow slave from piling bytes up in memory. SYNC_MASTER sends
wait here (``replicate``) until enough in-sync slaves hold them; reports complete the wait.

The decisions live in ``handshake.py`` and ``master.py``; this module reads the clock, moves
messages (protos/replication.proto) and calls the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc

from tidemq.protos import replication_pb2, replication_pb2_grpc
from tidemq.protos.wire import chunk_frame
from tidemq.replication.acks import GroupAck
from tidemq.replication.config import ReplicationConfig
from tidemq.replication.epochs import EpochEntry, EpochFile, EpochLog
from tidemq.replication.handshake import (
    Accept,
    Handshake,
    Identity,
    Refusal,
    RefusalKind,
    decide_by_epochs,
    decide_handshake,
)
from tidemq.replication.log import LogView, Probe
from tidemq.replication.master import Drop, MasterTracker, Send, SendHeartbeat, SlaveLag
from tidemq.storage import MessageStore
from tidemq.storage.clock import monotonic_ms
from tidemq.storage.errors import OffsetBelowMinError
from tidemq.storage.results import PutStatus

log = logging.getLogger(__name__)

R = replication_pb2

REFUSAL_STATUS = {
    RefusalKind.STRANGER: grpc.StatusCode.PERMISSION_DENIED,
    RefusalKind.NOT_MASTER: grpc.StatusCode.FAILED_PRECONDITION,
    RefusalKind.INCOMPATIBLE: grpc.StatusCode.INVALID_ARGUMENT,
    RefusalKind.PROTOCOL: grpc.StatusCode.INVALID_ARGUMENT,
    RefusalKind.NO_COMMON_HISTORY: grpc.StatusCode.OUT_OF_RANGE,
    RefusalKind.STALE_EPOCH: grpc.StatusCode.FAILED_PRECONDITION,
}


def handshake_from_proto(m: Any) -> Handshake:
    return Handshake(
        identity=Identity(m.cluster, m.broker_name, m.broker_id),
        commitlog_file_size=m.commitlog_file_size,
        empty=m.empty,
        min_offset=m.min_offset,
        max_offset=m.max_offset,
        probes=tuple(Probe(p.offset, p.length, p.crc32) for p in m.probes),
        address=m.address,
        group_epoch=m.group_epoch,
        epochs=tuple(EpochEntry(e.epoch, e.start_offset) for e in m.epochs),
    )


def decide(
    local: Identity, file_size: int, hs: Handshake, log: LogView, epochs: EpochLog | None
) -> Accept | Refusal:
    """Epochs first (automatic failover), records otherwise."""
    by_epochs = decide_by_epochs(hs, epochs.entries if epochs else (), log)
    if by_epochs is not None:
        return by_epochs
    return decide_handshake(local, file_size, hs, log)


class ReplicationServicer(replication_pb2_grpc.ReplicationServicer):  # type: ignore[misc]
    """The master's side. ``refuse`` is the hook that fails a refused stream; the broker
    overrides it to attach its typed ErrorDetail."""

    def __init__(self, store: MessageStore, identity: Identity, config: ReplicationConfig) -> None:
        self.store = store
        self.identity = identity
        self.config = config
        self.tracker = MasterTracker(config, store.config.commitlog_file_size_bytes)
        self._closing = False
        # Every link's sender waits on its event; an append wakes them all at once.
        self._wakes: set[asyncio.Event] = set()
        self._acks: GroupAck[asyncio.Future[None]] = GroupAck()
        # The highest offset a quorum of in-sync slaves ever held; never moves back, so what a
        # consumer was shown under confirm_offset stays shown.
        self.confirmed_offset = 0
        self._confirm_listeners: list[Callable[[int], None]] = []
        # Automatic failover: whether this broker is the master now, its epoch and epoch
        # file; each mastership is a generation, and links of an ended one stop.
        self.active = True
        self.epoch = 0
        self.epochs: EpochFile | None = None
        self._generation = 0

    def begin_mastership(
        self, epoch: int, epochs: EpochFile, isr: frozenset[int], confirmed_floor: int
    ) -> None:
        """This broker was elected: a fresh tracker under the new epoch and ISR. What it knew
        as confirmed while a slave stays confirmed (the confirm offset never moves back)."""
        self._generation += 1
        self.tracker = MasterTracker(self.config, self.store.config.commitlog_file_size_bytes)
        self.tracker.isr = isr
        self.tracker.master_id = self.identity.broker_id
        self.epoch = epoch
        self.epochs = epochs
        self.confirmed_offset = max(self.confirmed_offset, confirmed_floor)
        self.active = True

    def end_mastership(self) -> None:
        """Stepped down: every link ends at its next step and every SYNC send still waiting is
        answered unacknowledged."""
        self.active = False
        self._generation += 1
        self._fail_waiters("this broker is no longer the master")

    def set_isr(self, isr: frozenset[int]) -> None:
        """The ISR in force changed (a shrink releases sends that waited on a leaver)."""
        self.tracker.isr = isr
        self._advance()

    def _fail_waiters(self, reason: str) -> None:
        for e in self._wakes:
            e.set()
        for fut in self._acks.drain():
            if not fut.done():
                fut.set_exception(TimeoutError(reason))

    def close(self) -> None:
        """End every stream at its next step (shutdown: the server need not wait for them), and
        answer every SYNC send still waiting: it times out now rather than at the deadline."""
        self._closing = True
        self._fail_waiters("the master is shutting down")

    def add_confirm_listener(self, listener: Callable[[int], None]) -> None:
        """Called on the event loop whenever the confirmed offset moves up."""
        self._confirm_listeners.append(listener)

    def notify_appended(self) -> None:
        """New CommitLog bytes: every link sends them now instead of at its next poll."""
        for e in self._wakes:
            e.set()

    async def replicate(self, end_offset: int) -> PutStatus:
        """SYNC_MASTER: wait until ``min_insync_replicas`` in-sync slaves hold every byte below
        ``end_offset``. SLAVE_NOT_AVAILABLE at once without enough slaves in sync,
        FLUSH_SLAVE_TIMEOUT after ``sync_timeout_ms``. The wait is a future the ack handler
        completes; no thread waits."""
        if self.confirmed_offset >= end_offset:
            return PutStatus.PUT_OK
        if (
            self._closing
            or not self.active
            or not self.tracker.quorum_available(self.store.log.max_offset)
        ):
            return PutStatus.SLAVE_NOT_AVAILABLE
        fut: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self._acks.add(end_offset, fut)
        self.notify_appended()
        try:
            # asyncio.timeout, not wait_for: Python 3.11's wait_for can swallow a cancellation
            # that arrives as the awaited thing completes, and shutdown relies on cancelling.
            async with asyncio.timeout(self.config.sync_timeout_ms / 1000):
                await fut
        except TimeoutError:
            return PutStatus.FLUSH_SLAVE_TIMEOUT
        return PutStatus.PUT_OK

    def _advance(self) -> None:
        """The ack handler: after a report, move the confirmed offset and release every send it
        now covers (one report can acknowledge many sends: group acknowledgement)."""
        q = self.tracker.confirmed_offset(self.store.log.max_offset)
        if q is None or q <= self.confirmed_offset:
            return
        self.confirmed_offset = q
        for fut in self._acks.release(q):
            if not fut.done():
                fut.set_result(None)
        for listener in self._confirm_listeners:
            listener(q)

    def lags(self) -> list[SlaveLag]:
        store = self.store
        return self.tracker.lags(store.log.max_offset, store.dispatched_store_timestamp_ms)

    async def refuse(self, context: grpc.aio.ServicerContext, refusal: Refusal) -> NoReturn:
        await context.abort(REFUSAL_STATUS[refusal.kind], refusal.reason)
        raise AssertionError("unreachable: context.abort raises")

    async def admit_peer(self, identity: Identity, context: grpc.aio.ServicerContext) -> None:
        """Whether the peer may replicate as the broker its handshake names (a server with
        authentication checks it against the peer's certificate); aborts the call if not."""

    async def Stream(
        self, request_iterator: AsyncIterator[Any], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[Any]:
        cfg = self.config
        requests = aiter(request_iterator)
        try:
            async with asyncio.timeout(cfg.idle_timeout_ms / 1000):
                first = await anext(requests)
        except (TimeoutError, StopAsyncIteration):
            await self.refuse(context, Refusal(RefusalKind.PROTOCOL, "no Handshake arrived"))
        if first.WhichOneof("kind") != "handshake":
            await self.refuse(
                context, Refusal(RefusalKind.PROTOCOL, "the first message must be a Handshake")
            )
        hs = handshake_from_proto(first.handshake)
        await self.admit_peer(hs.identity, context)
        if not self.active:
            await self.refuse(
                context, Refusal(RefusalKind.NOT_MASTER, "this broker is not the master now")
            )
        if hs.group_epoch > self.epoch:
            await self.refuse(
                context,
                Refusal(
                    RefusalKind.STALE_EPOCH,
                    f"this master serves epoch {self.epoch}; the slave follows epoch "
                    f"{hs.group_epoch}",
                ),
            )
        store = self.store
        decision = await asyncio.to_thread(
            decide,
            self.identity,
            store.config.commitlog_file_size_bytes,
            hs,
            store.log,
            self.epochs.log if self.epochs is not None else None,
        )
        who = f"{hs.identity.broker_name}/{hs.identity.broker_id} at {context.peer()}"
        if isinstance(decision, Refusal):
            log.warning("replication refused to %s: %s", who, decision.reason)
            await self.refuse(context, decision)
        assert isinstance(decision, Accept)
        log.info("replication to %s accepted: %s", who, decision.reason)
        tracker = self.tracker  # a new mastership replaces it; this link stays with its own
        link = tracker.connect(hs.identity.broker_id, decision, monotonic_ms(), hs.address)
        wake = asyncio.Event()
        self._wakes.add(wake)
        # A reconnecting slave may already hold enough to confirm waiting sends.
        self._advance()
        reader = asyncio.create_task(self._read_reports(requests, link.link_id, wake))
        try:
            yield R.MasterMessage(
                accepted=R.HandshakeAccepted(
                    master_min_offset=decision.master_min_offset,
                    master_max_offset=decision.master_max_offset,
                    start_offset=decision.start_offset,
                    truncate=decision.truncate,
                    reason=decision.reason,
                    master_epoch=self.epoch,
                )
            )
            async for message in self._send_loop(link.link_id, wake, who):
                yield message
        finally:
            self._wakes.discard(wake)
            reader.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await reader
            tracker.disconnect(link.link_id)

    async def _send_loop(self, link_id: int, wake: asyncio.Event, who: str) -> AsyncIterator[Any]:
        poll_s = self.config.poll_interval_ms / 1000
        tracker = self.tracker
        commitlog = self.store.log
        generation = self._generation
        while not self._closing and self._generation == generation:
            end = commitlog.max_offset
            action = tracker.next_action(link_id, end, monotonic_ms())
            if isinstance(action, Drop):
                log.warning("replication to %s dropped: %s", who, action.reason)
                return
            if isinstance(action, Send):
                epoch, epoch_start, length = self._epoch_of(action.offset, action.length)
                try:
                    data = await asyncio.to_thread(self.store.read_raw, action.offset, length)
                except OffsetBelowMinError as e:
                    log.warning("replication to %s dropped: %s", who, e)
                    return
                if data:
                    # ``end`` as when the chunk was chosen: reaching it means caught up then.
                    tracker.on_sent(link_id, action.offset, len(data), monotonic_ms(), end)
                    # Encoded here, the data copied once (protobuf would copy it three
                    # times); the stream sends bytes as they are.
                    yield chunk_frame(
                        action.offset, data, epoch, epoch_start, self.confirmed_offset
                    )
                    continue
            elif isinstance(action, SendHeartbeat):
                tracker.on_heartbeat_sent(link_id, monotonic_ms())
                yield R.MasterMessage(
                    heartbeat=R.Heartbeat(
                        master_max_offset=commitlog.max_offset,
                        confirm_offset=self.confirmed_offset,
                    )
                )
                continue
            # Sends through the broker wake the loop (notify_appended); the poll is the backstop
            # for appends that bypass it. Reports wake it too (the window opened).
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(poll_s):
                    await wake.wait()
            wake.clear()

    def _epoch_of(self, offset: int, length: int) -> tuple[int, int, int]:
        """The epoch that wrote ``offset``, where it started, and the chunk length cut so the
        chunk stays inside it (a slave learns epoch boundaries from chunk headers)."""
        if self.epochs is None:
            return 0, 0, length
        entries = self.epochs.log
        entry = entries.epoch_at(offset)
        if entry is None:
            return 0, 0, length
        nxt = entries.next_start_after(entry.epoch)
        if nxt is not None and offset + length > nxt:
            length = nxt - offset
        return entry.epoch, entry.start_offset, length

    async def _read_reports(
        self, requests: AsyncIterator[Any], link_id: int, wake: asyncio.Event
    ) -> None:
        tracker = self.tracker
        try:
            async for m in requests:
                if m.WhichOneof("kind") != "report":
                    tracker.on_protocol_error(link_id, "only Reports may follow the Handshake")
                    break
                r = m.report
                tracker.on_report(
                    link_id,
                    r.max_offset,
                    monotonic_ms(),
                    r.last_store_timestamp_ms,
                    self.store.log.max_offset,
                )
                self._advance()
                wake.set()
            else:
                tracker.on_protocol_error(link_id, "the slave closed the stream")
        except grpc.aio.AioRpcError as e:
            tracker.on_protocol_error(link_id, f"stream failed: {e.code()}")
        wake.set()
