"""The slave's end of a replication link: ``SlaveClient`` keeps one stream to its master open.

It connects to the master's HA address (learnt from registration), handshakes with probes of its
own log (``log.slave_probes``), cuts its log back if the master says so, appends the chunks with
``append_raw`` (the store's dispatch thread then rebuilds ConsumeQueues and index from them), and
reports how far it got: under ``slave_flush = "sync"`` only as far as it has flushed, one flush
per burst of chunks. A dropped link is reconnected with tenacity and an exponential backoff
(``slave.ReconnectBackoff``), cut short, and started again from its shortest wait, when the
registry names a new master.

The decisions live in ``slave.py``; this module reads the clock, moves messages
(protos/replication.proto) and calls the store.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from typing import Any, NamedTuple

import grpc
from tenacity import AsyncRetrying, RetryCallState, retry_if_exception_type

from tidemq.protos import replication_pb2
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings, aio_channel
from tidemq.protos.wire import FrameError, parse_chunk_frame
from tidemq.replication.config import MAX_CHUNK_BYTES, ReplicationConfig, SlaveFlush
from tidemq.replication.epochs import BACKUP_SUFFIX, FILE_NAME, EpochFile
from tidemq.replication.handshake import Identity
from tidemq.replication.log import slave_probes
from tidemq.replication.slave import ProtocolError, ReconnectBackoff, ResyncFrom, SlaveSession
from tidemq.storage import MessageStore
from tidemq.storage.clock import monotonic_ms
from tidemq.storage.errors import StoreError

log = logging.getLogger(__name__)

R = replication_pb2

# What a slave accepts in one message: the largest chunk any master may be configured to send
# (the slave's own chunk_bytes says nothing about its master's) plus framing.
_MAX_MESSAGE_BYTES = MAX_CHUNK_BYTES + 64 * 1024


_STREAM_METHOD = "/tidemq.v1.Replication/Stream"


class ChunkFrame(NamedTuple):
    """A chunk as ``wire.parse_chunk_frame`` reads it: ``data`` a view of the message."""

    offset: int
    data: memoryview
    epoch: int
    epoch_start_offset: int
    confirm_offset: int


def master_message(raw: bytes) -> Any:
    """A message of the master's stream: a chunk parsed without copying its data, anything
    else by protobuf."""
    try:
        chunk = parse_chunk_frame(raw)
    except FrameError:
        chunk = None  # protobuf says what is wrong with it
    if chunk is not None:
        return ChunkFrame(*chunk)
    return R.MasterMessage.FromString(raw)


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
        tls: TlsSettings | None = None,
        credentials: Credentials | None = None,
    ) -> None:
        self.store = store
        self.identity = identity
        self.config = config
        self.tls = tls  # the slave's own certificate, when the group speaks TLS
        self.credentials = credentials  # its account, where the group has an ACL but no mTLS
        self.address = address  # what the master shows in its status and lag reports
        self.master_address = ""
        self._address_known = asyncio.Event()
        self.session: SlaveSession | None = None
        self.links = 0
        self.resyncs = 0  # times this slave set its store aside to resynchronise
        # Automatic failover: the epoch of the master to follow (a master at an older epoch is
        # refused), the epoch file chunks extend, and the master's confirm offset as last heard.
        self.group_epoch = 0
        self.epochs: EpochFile | None = None
        self.confirm_offset = 0
        self._call: Any = None
        self._warming = store.config.warm_ahead_bytes  # how far ahead the store warms now
        self._relink = asyncio.Event()  # a new master: cut a reconnect backoff short
        self._reconnect = ReconnectBackoff(
            config.reconnect_min_ms / 1000, config.reconnect_max_ms / 1000
        )

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
        self._reconnect.master_changed()
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
        await self._address_known.wait()
        while True:
            retrying = AsyncRetrying(
                retry=retry_if_exception_type(LinkDown),
                wait=lambda state: self._reconnect.wait(state.attempt_number),
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
        async with aio_channel(address, self.tls, options, self.credentials) as channel:
            stream = channel.stream_stream(
                _STREAM_METHOD,
                request_serializer=R.SlaveMessage.SerializeToString,
                response_deserializer=master_message,
            )
            call = self._call = stream()
            inbox: asyncio.Queue[Any] = asyncio.Queue()
            reader = asyncio.create_task(self._read(call, inbox))
            try:
                await self._handshake(call)
                session = SlaveSession(
                    cl.file_size,
                    cfg.report_interval_ms,
                    cfg.idle_timeout_ms,
                    monotonic_ms(),
                    flush_sync=cfg.slave_flush is SlaveFlush.SYNC,
                    max_unflushed_bytes=cfg.chunk_bytes,
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
                if isinstance(cut, ResyncFrom):
                    await asyncio.to_thread(self._resync, cut, cl.max_offset)
                elif cut is not None:
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
                if session.flush_sync:
                    # What an earlier link appended may not be durable yet: nothing is
                    # acknowledged until it is.
                    session.on_flushed(await asyncio.to_thread(store.flush_commitlog))
                log.info("replicating from %s at %d: %s", address, a.start_offset, a.reason)
                self.session = session
                self.links += 1
                self._warm(session)
                await self._receive(call, inbox, session)
            finally:
                self._warm(None)  # no link, no catching up
                self._call = None
                reader.cancel()
                with contextlib.suppress(asyncio.CancelledError):
                    await reader
                call.cancel()

    def _resync(self, resync: ResyncFrom, local_end: int) -> None:
        """The master no longer holds anything this log could continue from: set the store (and
        the epoch file, which describes it) aside and start again empty where the master's log
        starts. The epoch file goes first: a kill in between leaves a log without epochs, which
        the next handshake finds behind again."""
        aside = self.store.restart_empty_at(resync.offset, (FILE_NAME, FILE_NAME + BACKUP_SUFFIX))
        if self.epochs is not None:
            self.epochs.truncate_from(0)
        self.resyncs += 1
        log.warning(
            "replication: this slave's log ends at %d, below its master's min offset %d (the "
            "master's retention deleted what lies between): its store was set aside under %s "
            "(nothing deleted) and it resynchronises from %d",
            local_end,
            resync.offset,
            aside,
            resync.offset,
        )

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
            if session.flush_due(more_waiting=not inbox.empty()):
                session.on_flushed(await asyncio.to_thread(store.flush_commitlog))
            now = monotonic_ms()
            offset = session.ack_offset()
            if session.report_due(offset, now):
                ts = store.dispatched_store_timestamp_ms
                report = R.Report(max_offset=offset, last_store_timestamp_ms=ts)
                await call.write(R.SlaveMessage(report=report))
                session.on_reported(offset, now)
            m = await self._next(inbox, session)
            if m is None:
                continue
            if type(m) is ChunkFrame:
                data = m.data
                session.on_chunk(m.offset, len(data), monotonic_ms())
                self._note_epoch(m.epoch, m.epoch_start_offset)
                end = await asyncio.to_thread(store.append_raw, m.offset, data)
                session.on_appended(end)
                self._note_confirm(m.confirm_offset, end)
                self._warm(session)
                continue
            kind = m.WhichOneof("kind")
            if kind == "chunk":  # a chunk protobuf encoded in a way the frame parser leaves
                chunk = m.chunk
                data = chunk.data
                session.on_chunk(chunk.offset, len(data), monotonic_ms())
                self._note_epoch(chunk.epoch, chunk.epoch_start_offset)
                end = await asyncio.to_thread(store.append_raw, chunk.offset, data)
                session.on_appended(end)
                self._note_confirm(chunk.confirm_offset, end)
            elif kind == "heartbeat":
                session.on_heartbeat(m.heartbeat.master_max_offset, monotonic_ms())
                self._warm(session)
                self._note_confirm(m.heartbeat.confirm_offset, store.log.max_offset)
            else:
                raise ProtocolError(f"unexpected {kind} on an established link")

    def _warm(self, session: SlaveSession | None) -> None:
        """Warm the store ahead of its writes while the session is catching up (and as the
        store's own setting says otherwise)."""
        want = self.store.config.warm_ahead_bytes
        if session is not None:
            want = max(want, session.catch_up_warming(self.config.catch_up_warm_bytes))
        if want != self._warming:
            self.store.set_warm_ahead(want)
            self._warming = want

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
