"""The send path's side of idempotence: before the put, decide per message (store, duplicate,
or refuse the request) and stamp the first record of each run stored (``stamp``); right after
the put, in the same loop step, record the runs in the table; at the answer, put the
duplicates' first results in their places.

A duplicate is answered only once its first store is as durable as a new send would be
(``wait_originals``): the first attempt may still be waiting for its slaves when its retry
arrives.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import grpc

from tidemq.protos import common_pb2
from tidemq.services.broker.config import BrokerRole
from tidemq.services.broker.durability import waits_for_slaves
from tidemq.services.broker.idempotence.log_scan import LogScan, Mark
from tidemq.services.broker.idempotence.stamp import (
    PRODUCER_SEQ_PROPERTY,
    RUN_MEMBER_SYSFLAG,
    encode_stamp,
    encode_stamp_property,
)
from tidemq.services.broker.idempotence.table import (
    IdempotenceTable,
    Original,
    PartialRunError,
    ProducerFencedError,
    SequenceGapError,
)
from tidemq.services.broker.put_waits import (
    MasterReplication,
    StoredPut,
    SyncReplication,
    answer_status,
    wait_answerable,
)
from tidemq.services.errors import ServiceError, invalid
from tidemq.storage import (
    BlockPutResult,
    FlushMode,
    Message,
    MessageStore,
    PutResult,
    PutStatus,
    SentBlock,
)
from tidemq.storage.errors import OffsetBelowMinError, OffsetBeyondMaxError

if TYPE_CHECKING:
    from tidemq.services.broker.handlers.checks import BrokerChecks

_DISPATCH_WAIT_S = 10.0
# How long a request whose sequence is ahead of the table waits for the earlier request of its
# producer and queue (overtaken inside this broker) before it is refused with SEQUENCE_GAP.
GAP_WAIT_S = 0.25
SNAPSHOT_FILE = "idempotence/table.json"  # under the broker's store directory


SeqKey = tuple[str, int, int]  # (topic, queue, sequence) as the producer sent it


@dataclass(slots=True)
class SendPlan:
    """One idempotent request's decisions: None stores the message, an Original answers it."""

    producer_id: int
    epoch: int
    decisions: list[Original | None]
    keys: list[SeqKey]  # of each stored message, in order
    kept: list[int]  # the request's index of each stored message
    # Set by ``stamp`` when the put's order is not the request's: put position -> batch index.
    order: list[int] | None = None
    put_keys: list[SeqKey] | None = None  # ``keys`` in put order
    # [i, j) put positions of each run: one producer queue's consecutive sequences, stored in
    # one queue back to back, so at consecutive offsets there.
    runs: list[tuple[int, int]] = field(default_factory=list)

    def stored_wire(self, messages: Sequence[Any]) -> list[Any]:
        """The request's messages that are stored, in order (aligned with the put's batch)."""
        if len(self.kept) == len(messages):
            return list(messages)
        return [messages[i] for i in self.kept]


@dataclass(slots=True)
class BlockPlan:
    """One idempotent request of record blocks: per block of the request, None when it is
    stored, or the first store of a block that is a duplicate as a whole."""

    producer_id: int
    epoch: int
    decisions: list[Original | None]
    first_sequences: list[int]  # of each block of the request


def sequence_gap(message: str) -> ServiceError:
    return ServiceError(
        grpc.StatusCode.FAILED_PRECONDITION, common_pb2.SEQUENCE_GAP, message, retriable=True
    )


def producer_fenced(message: str) -> ServiceError:
    return ServiceError(grpc.StatusCode.FAILED_PRECONDITION, common_pb2.PRODUCER_FENCED, message)


class IdempotentSends:
    def __init__(
        self, store: MessageStore, max_producers: int, snapshot_dir: str | None = None
    ) -> None:
        self.store = store
        self.table = IdempotenceTable(max_producers)
        path = os.path.join(snapshot_dir, SNAPSHOT_FILE) if snapshot_dir else None
        self.scan = LogScan(store, self.table, path)
        # Set (and replaced) by every idempotent put: what a request behind a gap waits on.
        self._stored = asyncio.Event()
        self.duplicates = 0  # messages answered from their first store
        self.gaps = 0
        self.fenced = 0
        self.waiting_behind_gaps = 0  # requests now waiting for an earlier one (GAP_WAIT_S)

    async def before_put(
        self, request: Any, batch: list[Message]
    ) -> tuple[list[Message], SendPlan | None]:
        """What to store of ``batch`` (the request's messages as the store takes them) and the
        plan the answer follows; raises the request's typed refusal. Call it last before the
        put: nothing may run between its decision and the put."""
        pid = request.producer_id
        if not pid:
            for m in batch:
                if m.properties and PRODUCER_SEQ_PROPERTY in m.properties:
                    raise invalid(
                        f"property {PRODUCER_SEQ_PROPERTY} is the broker's (idempotent sends)",
                        common_pb2.INVALID_PROPERTY,
                    )
            return batch, None
        epoch = request.producer_epoch
        if pid < 0 or epoch < 0:
            raise invalid("producer_id must be > 0 and producer_epoch >= 0")
        # Keyed by the queue the producer named (a delayed message is stored elsewhere).
        seqs = [w.sequence for w in request.messages]
        if min(seqs) < 0:
            raise invalid("an idempotent message's sequence must be >= 0")
        # ``batch`` holds the request's topics and queues as plain attributes (cheaper to read).
        wanted = [((m.topic, m.queue_id), seq) for m, seq in zip(batch, seqs, strict=True)]
        decisions = await self._decide(lambda: self.table.decide(pid, epoch, wanted))
        if not any(decisions):  # no duplicate: the common case
            keys = [(topic, qid, seq) for (topic, qid), seq in wanted]
            return batch, SendPlan(pid, epoch, decisions, keys, list(range(len(batch))))
        store: list[Message] = []
        keys = []
        kept = []
        for i, (m, ((topic, qid), seq), d) in enumerate(zip(batch, wanted, decisions, strict=True)):
            if d is None:
                kept.append(i)
                store.append(m)
                keys.append((topic, qid, seq))
        return store, SendPlan(pid, epoch, decisions, keys, kept)

    async def _decide(self, decide: Callable[[], list[Original | None]]) -> list[Original | None]:
        """Catch the table up with the log and run ``decide``; a request whose sequence is
        ahead waits up to GAP_WAIT_S for the one before it. Raises the request's typed refusal.
        Nothing awaits between the table's last catch-up and the decision it returns, so the
        caller may put at once."""
        scan = self.scan
        if not scan.caught_up:  # a promoted master's first sends, or others' appends
            await scan.catch_up_fully()
        loop = asyncio.get_running_loop()
        gap_deadline = loop.time() + GAP_WAIT_S
        while True:
            while scan.catch_up():  # no await from here to the put
                pass
            try:
                return decide()
            except SequenceGapError as e:
                # Requests of one producer overtake each other inside the broker (each handler
                # awaits before its put): the earlier one is most likely a moment away. Wait
                # for it here rather than send the producer round a retry.
                left = gap_deadline - loop.time()
                if left <= 0:
                    self.gaps += 1
                    raise sequence_gap(str(e)) from None
                self.waiting_behind_gaps += 1
                try:
                    await self._next_store(left)
                finally:
                    self.waiting_behind_gaps -= 1
            except ProducerFencedError as e:
                self.fenced += 1
                raise producer_fenced(str(e)) from None
            except PartialRunError as e:
                raise invalid(str(e)) from None

    @staticmethod
    def stamp(plan: SendPlan | None, batch: list[Message]) -> list[Message]:
        """``batch`` (as it is put: delayed and half messages already moved to their system
        queues) in the order to put it, each run's first record stamped and the others flagged.

        A producer's request usually spreads over its queues message by message (round robin):
        put as sent, every record would be a run of its own, stamped and encoded the costly
        way. Put grouped by queue (stable: each queue's order is the request's), a request
        has a run per queue. Nothing orders messages across queues, so nobody can tell."""
        if plan is None:
            return batch
        keys = plan.keys
        # Indexes by (stored queue, producer's queue): a delayed run shares its stored queue.
        groups: dict[tuple[str, int, str, int], list[int]] = {}
        for i, m in enumerate(batch):
            k = keys[i]
            g = (m.topic, m.queue_id, k[0], k[1])
            members = groups.get(g)
            if members is None:
                groups[g] = [i]
            else:
                members.append(i)
        if len(groups) > 1:
            order = [i for members in groups.values() for i in members]
            if order != list(range(len(batch))):
                plan.order = order
                batch = [batch[i] for i in order]
                keys = plan.put_keys = [keys[i] for i in order]
        pid, epoch = plan.producer_id, plan.epoch
        runs = plan.runs = []
        at = 0
        for members in groups.values():  # in put order: a group's records lie back to back
            end = at + len(members)
            while at < end:  # the group's runs: its sequences, split where they skip
                j = at + 1
                seq = keys[at][2]
                while j < end and keys[j][2] == seq + j - at:
                    batch[j].sys_flag |= RUN_MEMBER_SYSFLAG
                    j += 1
                runs.append((at, j))
                head = batch[at]
                value = encode_stamp(pid, epoch, seq, j - at)
                props = head.properties
                if type(props) is dict:  # the request's own copy (to_store_message)
                    props[PRODUCER_SEQ_PROPERTY] = value
                else:
                    head.properties = {**props, PRODUCER_SEQ_PROPERTY: value}
                at = j
        return batch

    async def before_put_blocks(
        self, request: Any, blocks: list[SentBlock]
    ) -> tuple[list[SentBlock], BlockPlan | None]:
        """``before_put`` for a request of record blocks: the blocks to store (each stamped as
        one run: its head carries the stamp, its others the run-member flag) and the plan."""
        pid = request.producer_id
        if not pid:
            return blocks, None  # a block's own PRODUCER_SEQ is refused by the store's check
        epoch = request.producer_epoch
        if pid < 0 or epoch < 0:
            raise invalid("producer_id must be > 0 and producer_epoch >= 0")
        seqs = [b.first_sequence for b in request.blocks]
        if min(seqs) < 0:
            raise invalid("an idempotent block's first_sequence must be >= 0")
        runs = [
            ((b.topic, b.queue_id), seq, b.record_count)
            for b, seq in zip(blocks, seqs, strict=True)
        ]
        decisions = await self._decide(lambda: self.table.decide_runs(pid, epoch, runs))
        stored = [
            b._replace(
                head_property=encode_stamp_property(pid, epoch, seq, b.record_count),
                member_sys_flag=RUN_MEMBER_SYSFLAG,
            )
            for b, seq, d in zip(blocks, seqs, decisions, strict=True)
            if d is None
        ]
        return stored, BlockPlan(pid, epoch, decisions, seqs)

    def after_put_blocks(
        self,
        plan: BlockPlan | None,
        stored: Sequence[SentBlock],
        put: BlockPutResult | None,
        start: int,
    ) -> None:
        """Right after the put of ``stored`` (which began at log offset ``start``), in the same
        loop step: its runs go in the table and the scan skips them."""
        if put is None or not put.placements:
            return
        if plan is not None:
            signal, self._stored = self._stored, asyncio.Event()
            signal.set()  # requests waiting behind a gap decide again
            seqs = (s for s, d in zip(plan.first_sequences, plan.decisions, strict=True) if not d)
            for b, seq, placed in zip(stored, seqs, put.placements, strict=True):
                key = (b.topic, b.queue_id)
                self.table.record(
                    plan.producer_id, plan.epoch, key, seq, b.record_count, key,
                    placed.first_queue_offset,
                )  # fmt: skip
        last, placed = stored[-1], put.placements[-1]
        self.scan.skip_own(
            start,
            put.end,
            Mark(
                placed.last_phy_offset,
                placed.last_size,
                placed.first_queue_offset + placed.record_count - 1,
                last.topic,
            ),
        )

    async def _next_store(self, timeout_s: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(self._stored.wait(), timeout_s)

    def after_put(
        self, plan: SendPlan | None, batch: Sequence[Message], put: PutResult | None
    ) -> None:
        """Right after the put of ``batch`` (as ``stamp`` ordered it), in the same loop step:
        the stored runs go in the table; ``put.results`` is left in the request's order."""
        if put is None or not put.results:
            return
        if plan is not None:
            signal, self._stored = self._stored, asyncio.Event()
            signal.set()  # requests waiting behind a gap decide again
        results = put.results
        if plan is not None:
            record = self.table.record
            pid, epoch = plan.producer_id, plan.epoch
            keys = plan.put_keys if plan.put_keys is not None else plan.keys
            for i, j in plan.runs:
                topic, qid, seq = keys[i]
                stored = (batch[i].topic, batch[i].queue_id)
                record(pid, epoch, (topic, qid), seq, j - i, stored, results[i].queue_offset)
        last = results[-1]
        self.scan.skip_own(
            results[0].phy_offset,
            last.phy_offset + last.size,
            Mark(last.phy_offset, last.size, last.queue_offset, batch[-1].topic),
        )
        if plan is not None and plan.order is not None:
            in_request_order: list[Any] = [None] * len(results)
            for k, i in enumerate(plan.order):
                in_request_order[i] = results[k]
            put.results = in_request_order

    async def answer_status(
        self, put: StoredPut | None, replication: MasterReplication | None, checks: BrokerChecks
    ) -> PutStatus:
        """What a send's answer carries once its put is as durable as the answer promises
        (``put_waits.wait_answerable``), or, for a send whose every message was a duplicate
        (no put), once their first stores are."""
        if put is not None:
            return await wait_answerable(put, replication, checks)
        flushed, replicated = await self.wait_originals(replication, checks.role.role)
        return answer_status(flushed, replicated, checks)

    async def wait_originals(
        self, replication: SyncReplication | None, role: BrokerRole
    ) -> tuple[PutStatus, PutStatus | None]:
        """For a request whose every message is a duplicate: until the log as it is now (which
        holds the first stores) is as durable as a send's answer promises."""
        store = self.store
        end = store.log.max_offset
        loop = asyncio.get_running_loop()
        flushed = PutStatus.PUT_OK
        if store.config.flush_mode is FlushMode.SYNC:
            got = await loop.run_in_executor(None, store.flush_commitlog)
            flushed = PutStatus.PUT_OK if got >= end else PutStatus.FLUSH_DISK_TIMEOUT
        replicated = None
        if waits_for_slaves(role, replicating=replication is not None):
            assert replication is not None
            replicated = await replication.replicate(end)
        await loop.run_in_executor(None, store.wait_dispatched, end, _DISPATCH_WAIT_S)
        return flushed, replicated

    def fill(self, plan: SendPlan | None, response: Any, status: int) -> None:
        """Puts each duplicate's first result at its place among the stored messages'."""
        if plan is None or all(d is None for d in plan.decisions):
            return
        stored = list(response.results)
        del response.results[:]
        add = response.results.add
        it = iter(stored)
        for d in plan.decisions:
            if d is None:
                response.results.append(next(it))
                continue
            self.duplicates += 1
            r = add(status=status, duplicate=True, queue_id=d.queue_id, queue_offset=d.queue_offset)
            if d.queue_offset < 0:
                continue
            try:
                got = self.store.get_messages(d.topic, d.queue_id, d.queue_offset, 1).messages
            except (OffsetBelowMinError, OffsetBeyondMaxError):
                got = []
            if got:
                r.msg_id = got[0].msg_id
                r.commitlog_offset = got[0].phy_offset
