"""The thin grpc.aio layer of replication: the master's ``Replication`` servicer and the slave's
client loop. Decisions live in ``master.py`` and ``slave.py``; this module reads the clock, moves
messages (protos/replication.proto) and calls the store.

Master: one ``Stream`` call per slave. A reader task applies the slave's reports to the tracker;
the handler itself asks the tracker what to do next (send a chunk read with ``read_raw``, send a
heartbeat, wait, drop) and yields it. gRPC's own flow control and the tracker's in-flight bound
keep a slow slave from piling bytes up in memory.

Slave: ``SlaveClient.run`` connects to the master's HA address (learnt from registration),
handshakes, truncates if told to, appends chunks with ``append_raw`` (the store's dispatch thread
then rebuilds ConsumeQueues and index from them), and reports. A dropped link is reconnected
with tenacity's exponential backoff.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable
from typing import Any, NoReturn

import grpc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type, wait_exponential

from tidemq.protos import replication_pb2, replication_pb2_grpc
from tidemq.replication.acks import GroupAck
from tidemq.replication.config import MAX_CHUNK_BYTES, ReplicationConfig
from tidemq.replication.epochs import EpochEntry, EpochFile, EpochLog
from tidemq.replication.log import CommitLogView, Probe, slave_probes
from tidemq.replication.master import (
    Accept,
    Drop,
    Handshake,
    Identity,
    MasterTracker,
    Refusal,
    RefusalKind,
    Send,
    SendHeartbeat,
    SlaveLag,
    decide_by_epochs,
    decide_handshake,
)
from tidemq.replication.slave import ProtocolError, SlaveSession
from tidemq.storage import MessageStore
from tidemq.storage.clock import monotonic_ms
from tidemq.storage.errors import OffsetBelowMinError, StoreError
from tidemq.storage.results import PutStatus

log = logging.getLogger(__name__)

R = replication_pb2

# What a slave accepts in one message: the largest chunk any master may be configured to send
# (the slave's own chunk_bytes says nothing about its master's) plus framing.
_MAX_MESSAGE_BYTES = MAX_CHUNK_BYTES + 64 * 1024

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
    local: Identity, file_size: int, hs: Handshake, log: CommitLogView, epochs: EpochLog | None
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
            CommitLogView(store.log),
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
                    yield R.MasterMessage(
                        chunk=R.Chunk(
                            offset=action.offset,
                            data=data,
                            epoch=epoch,
                            epoch_start_offset=epoch_start,
                            confirm_offset=self.confirmed_offset,
                        )
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


def _raise_if_cancelling() -> None:
    """grpc.aio turns the cancellation of a task blocked in a call into the call's own error
    (CANCELLED): without this the slave would treat its shutdown as a dropped link and reconnect
    forever."""
    task = asyncio.current_task()
    if task is not None and task.cancelling():
        raise asyncio.CancelledError


class LinkDown(Exception):
    """The link ended before it proved healthy; the slave reconnects after a backoff."""


_EOF = object()


class SlaveClient:
    """The slave's side: keeps one replication link to its master up for as long as it runs."""

    def __init__(
        self,
        store: MessageStore,
        identity: Identity,
        config: ReplicationConfig,
        address: str = "",
    ) -> None:
        self.store = store
        self.identity = identity
        self.config = config
        self.address = address  # what the master shows in its status and lag reports
        self.master_address = ""
        self._address_known = asyncio.Event()
        self.session: SlaveSession | None = None
        self.links = 0
        # Automatic failover: the epoch of the master to follow (a master at an older epoch is
        # refused), the epoch file chunks extend, and the master's confirm offset as last heard.
        self.group_epoch = 0
        self.epochs: EpochFile | None = None
        self.confirm_offset = 0
        self._call: Any = None
        self._relink = asyncio.Event()  # a new master: cut a reconnect backoff short

    def set_master(self, address: str, epoch: int = 0) -> None:
        """The master's HA address (and, under automatic failover, its epoch), as the registry
        answered. A new master ends the current link at once: the next one goes to it."""
        if not address or (address, epoch) == (self.master_address, self.group_epoch):
            return
        log.info("replication master is now %s (epoch %d)", address, epoch)
        self.master_address = address
        self.group_epoch = max(self.group_epoch, epoch)
        self._address_known.set()
        self._relink.set()
        if self._call is not None:
            self._call.cancel()

    async def _backoff(self, seconds: float) -> None:
        """tenacity's sleep between attempts; a new master ends it at once (the backoff was
        for the old one)."""
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(seconds):
                await self._relink.wait()
        self._relink.clear()

    async def run(self) -> None:
        cfg = self.config
        await self._address_known.wait()
        while True:
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(LinkDown),
                wait=wait_exponential(
                    multiplier=cfg.reconnect_min_ms / 1000,
                    min=cfg.reconnect_min_ms / 1000,
                    max=cfg.reconnect_max_ms / 1000,
                ),
                before_sleep=self._log_retry,
                sleep=self._backoff,
            )
            # A link that was healthy for a while and then ended starts a fresh backoff.
            await retrying(self._link)

    @staticmethod
    def _log_retry(state: RetryCallState) -> None:
        exc = state.outcome.exception() if state.outcome is not None else None
        wait = state.next_action.sleep if state.next_action is not None else 0.0
        log.warning("replication link down (%s); reconnecting in %.1f s", exc, wait)

    async def _link(self) -> None:
        """One link. Returns if it ran healthy for at least a report interval before it ended;
        raises LinkDown otherwise."""
        address = self.master_address
        started = monotonic_ms()
        try:
            await self._stream(address)
        except (
            grpc.aio.AioRpcError,
            ProtocolError,
            StoreError,
            LinkDown,
            TimeoutError,
            asyncio.InvalidStateError,  # the call was cancelled under us: a new master
        ) as e:
            _raise_if_cancelling()
            reason = f"{e.code().name}: {e.details()}" if isinstance(e, grpc.aio.AioRpcError) else e
            if monotonic_ms() - started < self.config.report_interval_ms or self.session is None:
                raise LinkDown(f"{address}: {reason}") from e
            log.warning("replication link to %s ended: %s", address, reason)
        except Exception as e:  # a bug must not end replication for good: logged, retried
            _raise_if_cancelling()
            log.exception("replication link to %s failed unexpectedly", address)
            raise LinkDown(f"{address}: {e!r}") from e
        finally:
            self.session = None

    async def _stream(self, address: str) -> None:
        cfg = self.config
        store = self.store
        cl = store.log
        options = [("grpc.max_receive_message_length", _MAX_MESSAGE_BYTES)]
        async with grpc.aio.insecure_channel(address, options=options) as channel:
            call = self._call = replication_pb2_grpc.ReplicationStub(channel).Stream()
            inbox: asyncio.Queue[Any] = asyncio.Queue()
            reader = asyncio.create_task(self._read(call, inbox))
            try:
                await self._handshake(call)
                session = SlaveSession(
                    cl.file_size, cfg.report_interval_ms, cfg.idle_timeout_ms, monotonic_ms()
                )
                first = await self._next(inbox, session)
                if first is None or first.WhichOneof("kind") != "accepted":
                    raise ProtocolError("the master did not answer the handshake")
                a = first.accepted
                if a.master_epoch < self.group_epoch:
                    raise LinkDown(
                        f"{address} serves epoch {a.master_epoch}, older than the group's "
                        f"{self.group_epoch}"
                    )
                cut = session.on_accepted(
                    a.start_offset,
                    a.truncate,
                    a.reason,
                    a.master_max_offset,
                    local_empty=not cl.file_base_offsets(),
                    local_max_offset=cl.max_offset,
                    now_ms=monotonic_ms(),
                )
                if cut is not None:
                    n = await asyncio.to_thread(
                        store.truncate_to, cut.offset, f"replication: {cut.reason}"
                    )
                    if self.epochs is not None:
                        self.epochs.truncate_from(cut.offset)
                    log.warning(
                        "replication: cut %d bytes back to %d (kept under evidence/): %s",
                        n,
                        cut.offset,
                        cut.reason,
                    )
                log.info("replicating from %s at %d: %s", address, a.start_offset, a.reason)
                self.session = session
                self.links += 1
                await self._receive(call, inbox, session)
            finally:
                self._call = None
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                call.cancel()

    async def _handshake(self, call: Any) -> None:
        cl = self.store.log
        probes = await asyncio.to_thread(slave_probes, cl)
        me = self.identity
        wire_probes = [R.LogProbe(offset=p.offset, length=p.length, crc32=p.crc32) for p in probes]
        await call.write(
            R.SlaveMessage(
                handshake=R.Handshake(
                    cluster=me.cluster,
                    broker_name=me.broker_name,
                    broker_id=me.broker_id,
                    commitlog_file_size=cl.file_size,
                    empty=not cl.file_base_offsets(),
                    min_offset=cl.min_offset,
                    max_offset=cl.max_offset,
                    probes=wire_probes,
                    address=self.address,
                    group_epoch=self.group_epoch,
                    epochs=[
                        R.EpochEntry(epoch=e.epoch, start_offset=e.start_offset)
                        for e in (self.epochs.entries if self.epochs is not None else ())
                    ],
                )
            )
        )

    async def _receive(self, call: Any, inbox: asyncio.Queue[Any], session: SlaveSession) -> None:
        store = self.store
        while True:
            now = monotonic_ms()
            offset = session.expected_offset
            assert offset is not None
            if session.report_due(offset, now):
                ts = store.dispatched_store_timestamp_ms
                report = R.Report(max_offset=offset, last_store_timestamp_ms=ts)
                await call.write(R.SlaveMessage(report=report))
                session.on_reported(offset, now)
            m = await self._next(inbox, session)
            if m is None:
                continue
            kind = m.WhichOneof("kind")
            if kind == "chunk":
                chunk = m.chunk
                data = chunk.data
                session.on_chunk(chunk.offset, len(data), monotonic_ms())
                self._note_epoch(chunk.epoch, chunk.epoch_start_offset)
                end = await asyncio.to_thread(store.append_raw, chunk.offset, data)
                session.on_appended(end)
                self._note_confirm(chunk.confirm_offset, end)
            elif kind == "heartbeat":
                session.on_heartbeat(m.heartbeat.master_max_offset, monotonic_ms())
                self._note_confirm(m.heartbeat.confirm_offset, store.log.max_offset)
            else:
                raise ProtocolError(f"unexpected {kind} on an established link")

    def _note_epoch(self, epoch: int, start_offset: int) -> None:
        epochs = self.epochs
        if epochs is None or epoch <= 0 or epoch == epochs.last_epoch:
            return
        if epoch < epochs.last_epoch:
            raise ProtocolError(f"a chunk of epoch {epoch} after epoch {epochs.last_epoch}")
        try:
            epochs.append(epoch, start_offset)
        except ValueError as e:
            raise ProtocolError(f"chunk epoch header: {e}") from None

    def _note_confirm(self, confirm_offset: int, local_end: int) -> None:
        self.confirm_offset = max(self.confirm_offset, min(confirm_offset, local_end))

    async def _next(self, inbox: asyncio.Queue[Any], session: SlaveSession) -> Any | None:
        """The next message, or None when a report falls due first; raises when the link died."""
        now = monotonic_ms()
        if session.silent(now):
            raise LinkDown(f"master silent for {now - session.last_heard_ms} ms")
        timeout_s = max(0, session.next_deadline_ms() - now) / 1000
        try:
            async with asyncio.timeout(timeout_s):
                m = await inbox.get()
        except TimeoutError:
            return None
        if m is _EOF:
            raise LinkDown("the master ended the stream")
        if isinstance(m, BaseException):
            raise m
        return m

    @staticmethod
    async def _read(call: Any, inbox: asyncio.Queue[Any]) -> None:
        # Its own task: cancelling a pending read would cancel the whole call, so the session
        # times out on the queue instead.
        try:
            while True:
                m = await call.read()
                if m is grpc.aio.EOF:
                    inbox.put_nowait(_EOF)
                    return
                inbox.put_nowait(m)
        except grpc.aio.AioRpcError as e:
            inbox.put_nowait(e)
