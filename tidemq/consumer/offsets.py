"""Where a group's offsets are kept: committed to the broker each queue is read from
(clustering), or in a local file per group and ``instance_name`` (broadcasting, as RocketMQ's
LocalFileOffsetStore); and where a queue new to the group starts (``start_from``)."""

from __future__ import annotations

import asyncio
import logging
import os
from collections.abc import Callable

from tenacity import AsyncRetrying, retry_if_exception_type, stop_after_attempt

from tidemq.consumer.brokers import Brokers
from tidemq.consumer.config import ConsumerConfig
from tidemq.consumer.pulling import QueueState
from tidemq.errors import BrokerUnavailableError, RequestTimeoutError, TidemqError
from tidemq.local_offsets import LocalOffsetStore, queue_key
from tidemq.protos import broker_pb2
from tidemq.routes import MessageQueue

log = logging.getLogger(__name__)

# A master and a slave, then the master again if the slave failed too.
COMMIT_ATTEMPTS = 3


class Offsets:
    """Commits queue positions and finds where a queue starts; a failed commit is reported and
    retried with the next one."""

    def __init__(
        self,
        group: str,
        config: ConsumerConfig,
        brokers: Brokers,
        report: Callable[[TidemqError], None],
    ) -> None:
        self.group = group
        self.config = config
        self._brokers = brokers
        self._report = report
        self._local_offsets: dict[str, int] = {}
        self._local_store: LocalOffsetStore | None = None
        if config.mode == "broadcasting":
            base = config.local_offsets_dir or os.path.expanduser("~/.tidemq/offsets")
            self._local_store = LocalOffsetStore(base, group, config.instance_name)
            self._local_offsets = self._local_store.load()

    async def commit(self, states: list[QueueState], *, use_processed: bool) -> None:
        changed = False
        for st in states:
            offset = st.processed if use_processed else st.delivered
            if offset <= st.committed:
                continue
            if self.config.mode == "broadcasting":
                self._local_offsets[queue_key(st.mq)] = offset
                st.committed = offset
                changed = True
                continue
            metrics = self.config.metrics
            try:
                await self._commit_one(st, offset)
            except TidemqError as e:
                self._report(e)
                log.warning("committing %s at %d failed: %s", st.mq, offset, e)
                if metrics is not None:
                    metrics.committed(st.mq.topic, self.group, ok=False)
                continue
            if metrics is not None:
                metrics.committed(st.mq.topic, self.group, ok=True)
            st.committed = offset
        if changed and self._local_store is not None:
            await asyncio.get_running_loop().run_in_executor(
                None, self._local_store.save, dict(self._local_offsets)
            )

    async def _commit_one(self, st: QueueState, offset: int) -> None:
        """Commit at the broker ``st.mq`` is read from. A broker that cannot be reached is
        isolated by the call that failed, so the next attempt goes to another member of the
        group (a slave keeps the offset while the master is away): a consumer's last commit,
        made while it closes, must not be lost because the master died a moment before."""
        request = broker_pb2.CommitOffsetRequest(
            group=self.group, topic=st.mq.topic, queue_id=st.mq.queue_id, offset=offset
        )
        async for attempt in AsyncRetrying(
            retry=retry_if_exception_type((BrokerUnavailableError, RequestTimeoutError)),
            stop=stop_after_attempt(COMMIT_ATTEMPTS),
            reraise=True,
        ):
            with attempt:
                await self._brokers.broker_call(st.mq, "CommitOffset", request)

    async def initial(self, mq: MessageQueue) -> int:
        """Where the group reads ``mq`` from: its committed offset, else ``start_from``."""
        if self.config.mode == "broadcasting":
            stored = self._local_offsets.get(queue_key(mq))
            if stored is not None:
                return stored
        else:
            resp = await self._brokers.broker_call(
                mq,
                "QueryConsumerOffset",
                broker_pb2.QueryConsumerOffsetRequest(
                    group=self.group, topic=mq.topic, queue_id=mq.queue_id
                ),
            )
            if resp.found:
                return int(resp.offset)
        start = self.config.start_from
        if isinstance(start, int):
            resp = await self._brokers.broker_call(
                mq,
                "SearchOffset",
                broker_pb2.SearchOffsetRequest(
                    topic=mq.topic, queue_id=mq.queue_id, timestamp_ms=start
                ),
            )
            return int(resp.offset)
        resp = await self._brokers.broker_call(
            mq,
            "GetQueueOffsets",
            broker_pb2.GetQueueOffsetsRequest(topic=mq.topic, queue_ids=[mq.queue_id]),
        )
        q = resp.queues[0]
        return int(q.min_offset if start == "first" else q.max_offset)
