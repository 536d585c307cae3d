"""The SDK's decisions that need no broker: queue allocation, fault isolation, routes, errors."""

from __future__ import annotations

import itertools

import grpc
import pytest
from hypothesis import given
from hypothesis import strategies as st

from tidemq import errors
from tidemq.allocate import allocate_averagely
from tidemq.errors import from_rpc_error
from tidemq.fault import LatencyFaultTolerance
from tidemq.protos import common_pb2, nameserver_pb2
from tidemq.protos.errors import error_metadata
from tidemq.routes import MessageQueue, TopicRoute
from tidemq.types import ReceivedMessage, SendStatus, send_status

pytestmark = pytest.mark.unit


@given(
    n_queues=st.integers(0, 40),
    members=st.lists(st.text("abcdef0123", min_size=1, max_size=6), unique=True, max_size=12),
)
def test_allocation_gives_each_queue_exactly_one_member(n_queues: int, members: list[str]) -> None:
    queues = [MessageQueue("t", f"b{q % 3}", q) for q in range(n_queues)]
    queues.sort()
    members.sort()
    owned = [allocate_averagely(queues, members, m) for m in members]
    flat = list(itertools.chain.from_iterable(owned))
    if members:
        assert sorted(flat) == queues  # none orphaned, none twice
        sizes = [len(o) for o in owned]
        assert max(sizes) - min(sizes) <= 1  # averagely
    else:
        assert flat == []


def test_allocation_matches_rocketmq_averagely() -> None:
    queues = list(range(8))
    members = ["a", "b", "c"]
    assert [allocate_averagely(queues, members, m) for m in members] == [
        [0, 1, 2],
        [3, 4, 5],
        [6, 7],
    ]
    assert allocate_averagely(queues, members, "stranger") == []
    assert allocate_averagely(list(range(2)), members, "c") == []


def test_failed_broker_is_avoided_for_the_isolation_time() -> None:
    ft = LatencyFaultTolerance()
    ft.record_failure("a", now_ms=1_000)
    assert not ft.is_available("a", 1_000 + 29_999)
    assert ft.is_available("a", 1_000 + 30_000)
    assert ft.is_available("b", 1_000)


def test_slow_answers_isolate_by_rocketmq_latency_table() -> None:
    ft = LatencyFaultTolerance()
    ft.record_latency("fast", 99, now_ms=0)
    assert ft.is_available("fast", 0)
    ft.record_latency("slow", 600, now_ms=0)  # >= 550 ms: 30 s
    assert not ft.is_available("slow", 29_999) and ft.is_available("slow", 30_000)
    ft.record_success("slow")
    assert ft.is_available("slow", 1)


def test_least_bad_is_the_one_that_recovers_first() -> None:
    ft = LatencyFaultTolerance()
    ft.record_failure("a", now_ms=5_000)
    ft.record_failure("b", now_ms=1_000)
    assert ft.pick_least_bad(["a", "b"]) == "b"


def _route(*brokers: tuple[str, dict[int, str], int], perm: int = 6) -> TopicRoute:
    resp = nameserver_pb2.QueryRouteResponse(topic="t")
    for name, addresses, epoch in brokers:
        resp.brokers.add(cluster="c", broker_name=name, addresses=addresses, epoch=epoch)
        resp.queues.add(broker_name=name, read_queue_nums=2, write_queue_nums=3, perm=perm)
    return TopicRoute.from_proto("t", resp)


def test_route_writes_only_to_groups_with_a_master() -> None:
    route = _route(("a", {0: "h:1", 1: "h:2"}, 0), ("b", {1: "h:3"}, 0))
    assert [str(q) for q in route.write_queues] == ["t@a#0", "t@a#1", "t@a#2"]
    assert len(route.read_queues) == 4  # b's slave still serves reads
    assert route.groups["b"].read_address() == "h:3"


def test_route_prefers_the_higher_epoch_when_two_claim_a_group() -> None:
    route = _route(("a", {0: "old:1"}, 3), ("a", {0: "new:1"}, 4), ("a", {0: "older:1"}, 2))
    assert route.groups["a"].master == "new:1"


def test_read_only_topic_has_no_write_queues() -> None:
    assert _route(("a", {0: "h:1"}, 0), perm=4).write_queues == ()


def test_send_status_mapping_refuses_unknown_values() -> None:
    assert send_status(1) is SendStatus.SEND_OK
    assert send_status(4) is SendStatus.SLAVE_NOT_AVAILABLE
    with pytest.raises(ValueError, match="unknown send status 9"):
        send_status(9)


def test_received_message_as_dict_shows_binary_bodies_as_hex() -> None:
    m = ReceivedMessage("t", 0, 1, b"\xff\x00", None, (), {}, "id", 1, 2, "b")
    assert m.as_dict()["body"] == "ff00" and m.as_dict()["body_encoding"] == "hex"


class _Failed(grpc.RpcError):  # type: ignore[misc]
    """What a failed grpc call raises: status, details, trailers."""

    def __init__(self, status: grpc.StatusCode, metadata: tuple = ()) -> None:  # type: ignore[type-arg]
        self._status, self._metadata = status, metadata

    def code(self) -> grpc.StatusCode:
        return self._status

    def details(self) -> str:
        return "details"

    def trailing_metadata(self) -> tuple:  # type: ignore[type-arg]
        return self._metadata


def test_typed_detail_decides_class_and_retriable() -> None:
    detail = common_pb2.ErrorDetail(
        code=common_pb2.DISK_FULL, message="disk 95% full", retriable=True
    )
    e = from_rpc_error(_Failed(grpc.StatusCode.RESOURCE_EXHAUSTED, error_metadata(detail)), "b1")
    assert isinstance(e, errors.DiskFullError) and e.retriable
    assert (e.code, str(e)) == ("DISK_FULL", "DISK_FULL: disk 95% full (b1)")
    bad = common_pb2.ErrorDetail(code=common_pb2.INVALID_TOPIC, message="bad")
    e = from_rpc_error(_Failed(grpc.StatusCode.INVALID_ARGUMENT, error_metadata(bad)))
    assert isinstance(e, errors.InvalidArgumentError) and not e.retriable


@pytest.mark.parametrize(
    ("status", "cls", "retriable"),
    [
        (grpc.StatusCode.UNAVAILABLE, errors.BrokerUnavailableError, True),
        (grpc.StatusCode.DEADLINE_EXCEEDED, errors.RequestTimeoutError, True),
        (grpc.StatusCode.INTERNAL, errors.TidemqError, False),
        (grpc.StatusCode.UNKNOWN, errors.TidemqError, False),
    ],
)
def test_status_without_detail_falls_back_on_the_grpc_code(
    status: grpc.StatusCode, cls: type, retriable: bool
) -> None:
    e = from_rpc_error(_Failed(status))
    assert type(e) is cls and e.retriable is retriable and e.code == status.name
