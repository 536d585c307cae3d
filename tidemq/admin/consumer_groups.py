"""Consumer groups in the admin client: their settings (RocketMQ's subscription group config:
model, max delivery attempts, retry policy, FIFO, consume enabled) and the in-flight state of a
receive group (its dead-letter queue is in ``dead_letters``).

A group's config lives on every master (as topics do); changes go to every master and reach
the slaves by config sync. ``AsyncConsumerGroups`` is mixed into ``AsyncAdmin``,
``ConsumerGroups`` into ``Admin``.
"""

from __future__ import annotations

import asyncio
import math
from collections.abc import Coroutine, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, TypeVar

from tidemq._runtime import LoopThread
from tidemq.errors import (
    InvalidArgumentError,
    NotFoundError,
    RouteNotFoundError,
)
from tidemq.protos import broker_pb2
from tidemq.routes import NameServerClient

T = TypeVar("T")

# RocketMQ's 18 levels, 1 s .. 2 h: what a group without a customized policy waits.
DEFAULT_DELAYS_MS = (
    1_000, 5_000, 10_000, 30_000, 60_000, 120_000, 180_000, 240_000, 300_000, 360_000,
    420_000, 480_000, 540_000, 600_000, 1_200_000, 1_800_000, 3_600_000, 7_200_000,
)  # fmt: skip
MODELS = {"offsets": broker_pb2.OFFSETS, "receive": broker_pb2.RECEIVE}
_MODEL_NAMES = {v: k for k, v in MODELS.items()}
_MODE_NAMES = {broker_pb2.CLUSTERING: "clustering", broker_pb2.BROADCASTING: "broadcasting"}


@dataclass(frozen=True)
class RetryPolicy:
    """How long a failed message waits before its next delivery. ``delays_ms`` (RocketMQ's
    customized policy) wins when given: delivery n that failed waits
    ``delays_ms[min(n, len) - 1]``; otherwise exponential from ``initial_ms`` times
    ``multiplier`` per attempt, at most ``max_ms``."""

    delays_ms: tuple[int, ...] = DEFAULT_DELAYS_MS
    initial_ms: int = 1_000
    max_ms: int = 7_200_000
    multiplier: float = 2.0

    def __post_init__(self) -> None:
        object.__setattr__(self, "delays_ms", tuple(int(d) for d in self.delays_ms))
        if any(d <= 0 for d in self.delays_ms):
            raise ValueError("retry delays must be > 0 ms")
        if not self.delays_ms and not (
            0 < self.initial_ms <= self.max_ms
            and math.isfinite(self.multiplier)
            and self.multiplier >= 1
        ):
            raise ValueError("exponential retry: 0 < initial_ms <= max_ms and multiplier >= 1")

    @classmethod
    def exponential(
        cls, initial_ms: int = 1_000, max_ms: int = 7_200_000, multiplier: float = 2.0
    ) -> RetryPolicy:
        return cls((), initial_ms, max_ms, multiplier)

    @classmethod
    def from_proto(cls, p: Any) -> RetryPolicy:
        if not p.delays_ms and not p.initial_ms:
            return cls()  # unset: the broker's defaults
        return cls(tuple(p.delays_ms), p.initial_ms, p.max_ms, p.multiplier)

    def to_proto(self) -> Any:
        return broker_pb2.RetryPolicy(
            delays_ms=list(self.delays_ms),
            initial_ms=self.initial_ms,
            max_ms=self.max_ms,
            multiplier=self.multiplier,
        )


@dataclass(frozen=True)
class ConsumerGroup:
    group: str
    model: str  # "offsets", "receive", or "" while no member has used it
    mode: str  # "clustering" or "broadcasting" (offsets model)
    topics: tuple[str, ...]
    created_ms: int
    max_delivery_attempts: int
    retry_policy: RetryPolicy
    fifo: bool
    consume_enabled: bool
    brokers: tuple[str, ...] = ()  # the broker groups that know it

    @classmethod
    def from_proto(cls, g: Any, brokers: Sequence[str] = ()) -> ConsumerGroup:
        s = g.settings
        return cls(
            group=g.group,
            model=_MODEL_NAMES.get(g.model, ""),
            mode=_MODE_NAMES.get(g.mode, ""),
            topics=tuple(g.topics),
            created_ms=g.created_ms,
            max_delivery_attempts=s.max_delivery_attempts,
            retry_policy=RetryPolicy.from_proto(s.retry_policy),
            fifo=s.fifo,
            consume_enabled=s.consume_enabled,
            brokers=tuple(sorted(brokers)),
        )


@dataclass(frozen=True)
class QueueReceiveState:
    broker: str
    topic: str
    queue_id: int
    done_offset: int  # every offset below is acked, dead-lettered or filtered out
    next_offset: int  # every offset from here on was never looked at for the group
    inflight: int  # invisible now (held by a member)
    retrying: int  # failed, waiting for their retry time (or visible again)
    blocked: int  # FIFO: held back behind an earlier message of their message group
    max_offset: int

    @property
    def lag(self) -> int:
        """Messages not done yet (in flight, retrying, blocked or never received)."""
        return max(0, self.max_offset - self.done_offset)


@dataclass(frozen=True)
class ReceiveState:
    queues: list[QueueReceiveState] = field(default_factory=list)
    dead_letters: int = 0  # messages in %DLQ%<group>


class AsyncConsumerGroups:
    """Mixed into ``AsyncAdmin``, which provides ``_call``, ``masters``, ``cluster_info`` and
    ``nameserver``."""

    if TYPE_CHECKING:
        nameserver: NameServerClient

        async def _call(
            self, address: str, method: str, request: Any, timeout_s: float = ...
        ) -> Any: ...

        async def masters(self, cluster: str | None = None) -> dict[str, str]: ...

        async def cluster_info(self) -> Any: ...

    async def get_consumer_group(self, group: str) -> ConsumerGroup:
        """The group's config (as the first master by name has it), and which broker groups
        know it; ``NotFoundError`` when none does."""
        found = await self._each_master(
            lambda a: self._call(
                a, "GetConsumerGroup", broker_pb2.GetConsumerGroupRequest(group=group)
            )
        )
        known = {name: r.group for name, r in found.items() if r.HasField("group")}
        if not known:
            raise NotFoundError(f"consumer group {group!r} not found", code="GROUP_NOT_FOUND")
        return ConsumerGroup.from_proto(known[min(known)], list(known))

    async def update_consumer_group(
        self,
        group: str,
        *,
        max_delivery_attempts: int | None = None,
        retry_delays_s: Sequence[float] | None = None,
        retry_policy: RetryPolicy | None = None,
        fifo: bool | None = None,
        consume_enabled: bool | None = None,
        model: str | None = None,
        cluster: str | None = None,
    ) -> ConsumerGroup:
        """Changes the named settings on every master (of ``cluster``, default all); a group
        that does not exist is created with defaults first. ``model`` ("offsets" or
        "receive") is an operator's change of model: stop the group's consumers first."""
        if not isinstance(group, str) or not group:
            raise InvalidArgumentError("group is required", code="INVALID_ARGUMENT")
        request = broker_pb2.UpdateConsumerGroupRequest(group=group)
        if max_delivery_attempts is not None:
            request.max_delivery_attempts = max_delivery_attempts
        if retry_delays_s is not None and retry_policy is not None:
            raise InvalidArgumentError(
                "give retry_delays_s or retry_policy, not both", code="INVALID_ARGUMENT"
            )
        try:
            if retry_delays_s is not None:
                retry_policy = RetryPolicy(tuple(round(d * 1000) for d in retry_delays_s))
        except ValueError as e:
            raise InvalidArgumentError(str(e), code="INVALID_ARGUMENT") from None
        if retry_policy is not None:
            request.retry_policy.CopyFrom(retry_policy.to_proto())
        if fifo is not None:
            request.fifo = fifo
        if consume_enabled is not None:
            request.consume_enabled = consume_enabled
        if model is not None:
            if model not in MODELS:
                raise InvalidArgumentError(
                    f"model must be one of {sorted(MODELS)}, not {model!r}",
                    code="INVALID_ARGUMENT",
                )
            request.model = MODELS[model]
        masters = await self.masters(cluster)
        if not masters:
            raise RouteNotFoundError("no master broker to update", code="ROUTE_NOT_FOUND")
        answers = await asyncio.gather(
            *(self._call(a, "UpdateConsumerGroup", request) for a in masters.values())
        )
        first = dict(zip(masters, answers, strict=True))[min(masters)]
        return ConsumerGroup.from_proto(first.group, list(masters))

    async def list_consumer_groups(self) -> list[ConsumerGroup]:
        """Every group any master knows, by name (the config of the first master by name)."""
        found = await self._each_master(
            lambda a: self._call(a, "ListConsumerGroups", broker_pb2.ListConsumerGroupsRequest())
        )
        by_group: dict[str, tuple[Any, list[str]]] = {}
        for name in sorted(found):
            for g in found[name].groups:
                entry = by_group.setdefault(g.group, (g, []))
                entry[1].append(name)
        return [
            ConsumerGroup.from_proto(g, names)
            for g, names in (by_group[k] for k in sorted(by_group))
        ]

    async def delete_consumer_group(self, group: str) -> list[str]:
        """Deletes the group's config from every master; the broker groups it was on."""
        request = broker_pb2.DeleteConsumerGroupRequest(group=group)
        deleted = []
        for name, address in sorted((await self.masters()).items()):
            try:
                await self._call(address, "DeleteConsumerGroup", request)
            except NotFoundError:
                continue
            deleted.append(name)
        return deleted

    async def receive_state(self, group: str, topic: str | None = None) -> ReceiveState:
        """A receive group's in-flight figures per queue (each broker group's master, or a
        slave while it has none)."""
        request = broker_pb2.GetReceiveStateRequest(group=group, topic=topic or "")
        queues: list[QueueReceiveState] = []
        dead = 0
        for name, address in sorted((await self._readable()).items()):
            resp = await self._call(address, "GetReceiveState", request)
            dead += resp.dead_letters
            queues += [
                QueueReceiveState(
                    name,
                    q.topic,
                    q.queue_id,
                    q.done_offset,
                    q.next_offset,
                    q.inflight,
                    q.retrying,
                    q.blocked,
                    q.max_offset,
                )
                for q in resp.queues
            ]
        queues.sort(key=lambda q: (q.topic, q.broker, q.queue_id))
        return ReceiveState(queues, dead)

    async def _each_master(self, call: Any) -> dict[str, Any]:
        """broker name -> answer of its master; a master that does not know the thing asked
        for (NotFoundError) is left out."""
        masters = await self.masters()
        out: dict[str, Any] = {}
        for name, address in sorted(masters.items()):
            try:
                out[name] = await call(address)
            except NotFoundError:
                continue
        return out

    async def _readable(self) -> dict[str, str]:
        """broker name -> its master, or its lowest slave while it has none."""
        info = await self.cluster_info()
        out: dict[str, str] = {}
        for c in info.clusters:
            for g in c.groups:
                if g.addresses:
                    out[g.broker_name] = (
                        g.addresses[0] if 0 in g.addresses else g.addresses[min(g.addresses)]
                    )
        return out


class ConsumerGroups:
    """Mixed into ``Admin``: the blocking versions."""

    if TYPE_CHECKING:
        _core: AsyncConsumerGroups
        _runner: LoopThread

    def _wait(self, coro: Coroutine[Any, Any, T]) -> T:
        return self._runner.run(coro)

    def get_consumer_group(self, group: str) -> ConsumerGroup:
        return self._wait(self._core.get_consumer_group(group))

    def update_consumer_group(self, group: str, **settings: Any) -> ConsumerGroup:
        return self._wait(self._core.update_consumer_group(group, **settings))

    def list_consumer_groups(self) -> list[ConsumerGroup]:
        return self._wait(self._core.list_consumer_groups())

    def delete_consumer_group(self, group: str) -> list[str]:
        return self._wait(self._core.delete_consumer_group(group))

    def receive_state(self, group: str, topic: str | None = None) -> ReceiveState:
        return self._wait(self._core.receive_state(group, topic))
