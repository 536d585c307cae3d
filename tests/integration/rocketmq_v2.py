"""Talking to a broker's RocketMQ 5 listener with our own ``apache.rocketmq.v2`` stubs (the
official clients run in their own processes, ``tests/interop``): a channel whose calls carry a
client id, as every official client's do, and a routed broker that serves the protocol."""

from __future__ import annotations

import queue
import threading
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import grpc

from tests.integration.conftest import (
    SMALL_STORE,
    BrokerProcess,
    NameServerProcess,
    StartBroker,
    free_port,
    spawn,
)
from tidemq.protos import broker_pb2, common_pb2
from tidemq.protos.rocketmq import definition_pb2 as v2
from tidemq.protos.rocketmq import service_pb2, service_pb2_grpc

BROKER_GROUP = "broker-a"
CALL_TIMEOUT_S = 10.0


@contextmanager
def shared_cluster(
    tmp: Path, *flags: str, topics: dict[str, int]
) -> Iterator[tuple[NameServerProcess, BrokerProcess]]:
    """A nameserver and a master of ``broker-a`` serving the RocketMQ 5 protocol, with
    ``topics`` (name -> queues) created, for a whole test module (a cluster per test would
    take most of the module's time); both are stopped at the end, their logs printed on
    failure."""
    ns_address = f"127.0.0.1:{free_port()}"
    ns = NameServerProcess(
        spawn(["nameserver", "--listen", ns_address], tmp / "nameserver.log"),
        ns_address,
        tmp / "nameserver.log",
    )
    started: list[NameServerProcess | BrokerProcess] = [ns]
    try:
        ns.wait_serving()
        address, v2_address = f"127.0.0.1:{free_port()}", f"127.0.0.1:{free_port()}"
        args = ["broker", "--listen", address, "--store", str(tmp / "store")]
        args += ["--nameserver", ns_address, "--broker-name", BROKER_GROUP]
        args += ["--register-interval-ms", "500", "--rocketmq-listen", v2_address]
        args += ["--store-overrides", SMALL_STORE, *flags]
        broker = BrokerProcess(
            spawn(args, tmp / "broker.log"),
            address,
            tmp / "broker.log",
            store_dir=tmp / "store",
            rocketmq_address=v2_address,
        )
        started.append(broker)
        broker.wait_serving()
        for topic, queues in topics.items():
            config = common_pb2.TopicConfig(
                topic=topic, read_queue_nums=queues, write_queue_nums=queues, perm=6
            )
            broker.stub().CreateTopic(broker_pb2.CreateTopicRequest(topic=config), timeout=10)
        yield ns, broker
    except BaseException:
        for p in started:
            print(f"----- {p.log_path.name} -----\n{p.log()}")
        raise
    finally:
        for p in reversed(started):
            if p.proc.poll() is None:
                p.terminate()


def v2_broker(
    start_broker: StartBroker, ns: NameServerProcess, *flags: str, store: str = BROKER_GROUP
) -> BrokerProcess:
    """A master of ``broker-a`` registered with ``ns``, serving the RocketMQ 5 protocol."""
    return start_broker(
        *("--nameserver", ns.address, "--broker-name", BROKER_GROUP),
        *("--register-interval-ms", "500", *flags),
        store=store,
        rocketmq=True,
    )


class V2:
    """One client (one ``x-mq-client-id``) on one broker's v2 listener."""

    def __init__(self, channel: grpc.Channel, client_id: str) -> None:
        self.stub = service_pb2_grpc.MessagingServiceStub(channel)
        self.client_id = client_id
        self.metadata = (("x-mq-client-id", client_id), ("x-mq-language", "PYTHON"))

    def call(self, name: str, request: object, **kwargs: object) -> Any:
        kwargs.setdefault("timeout", CALL_TIMEOUT_S)
        kwargs.setdefault("metadata", self.metadata)
        return getattr(self.stub, name)(request, **kwargs)

    def query_route(self, topic: str) -> Any:
        return self.call("QueryRoute", service_pb2.QueryRouteRequest(topic=v2.Resource(name=topic)))

    def send(self, *messages: Any) -> Any:
        return self.call("SendMessage", service_pb2.SendMessageRequest(messages=messages))


@contextmanager
def v2_client(broker: BrokerProcess, client_id: str = "") -> Iterator[V2]:
    with grpc.insecure_channel(broker.rocketmq_address) as channel:
        yield V2(channel, client_id or f"test@{uuid.uuid4().hex[:12]}")


def message(topic: str, body: bytes, message_id: str = "", **system: object) -> Any:
    """A message as an official client builds it (NORMAL unless ``message_type`` says)."""
    m = v2.Message(topic=v2.Resource(name=topic), body=body)
    sp = m.system_properties
    sp.message_id = message_id or "01" + uuid.uuid4().hex[:32].upper()
    sp.message_type = v2.NORMAL
    sp.body_encoding = v2.IDENTITY
    sp.born_host = "127.0.0.1"
    sp.born_timestamp.GetCurrentTime()
    sp.born_timestamp.nanos = 0  # the Python client sends whole seconds
    for key, value in system.items():
        if isinstance(value, list):
            getattr(sp, key).extend(value)
        elif hasattr(value, "CopyFrom"):
            getattr(sp, key).CopyFrom(value)
        else:
            setattr(sp, key, value)
    return m


class Stream:
    """One Telemetry stream: commands written from the test, the broker's read back in order
    (a thread reads them as they come)."""

    def __init__(self, client: V2, timeout_s: float = 60) -> None:
        self._out: queue.Queue[service_pb2.TelemetryCommand | None] = queue.Queue()
        self._in: queue.Queue[Any] = queue.Queue()
        self.answers = client.stub.Telemetry(
            self._requests(), metadata=client.metadata, timeout=timeout_s
        )
        self._reader = threading.Thread(target=self._read_all, daemon=True)
        self._reader.start()

    def _requests(self) -> Iterator[service_pb2.TelemetryCommand]:
        while (command := self._out.get()) is not None:
            yield command

    def _read_all(self) -> None:
        try:
            for answer in self.answers:
                self._in.put(answer)
        except grpc.RpcError as e:
            self._in.put(e)
        self._in.put(None)  # the broker ended the stream

    def write(self, command: service_pb2.TelemetryCommand) -> None:
        self._out.put(command)

    def read(self, timeout_s: float = 10) -> Any:
        """The broker's next command (None once it ended the stream)."""
        try:
            answer = self._in.get(timeout=timeout_s)
        except queue.Empty:
            raise AssertionError(f"no telemetry command within {timeout_s} s") from None
        if isinstance(answer, grpc.RpcError):
            raise answer
        return answer

    def close(self) -> list[Any]:
        """Close our side; what the broker still sent before it ended the stream."""
        self._out.put(None)
        self._reader.join(10)
        assert not self._reader.is_alive(), "the broker did not end the stream"
        rest = []
        while (answer := self._in.get_nowait()) is not None:
            rest.append(answer)
        return rest


def producer_settings(*topics: str) -> service_pb2.TelemetryCommand:
    s = v2.Settings(client_type=v2.PRODUCER)
    for topic in topics:
        s.publishing.topics.add(name=topic)
    s.publishing.max_body_size = 134_217_728
    s.publishing.validate_message_type = True
    s.request_timeout.seconds = 3
    return service_pb2.TelemetryCommand(settings=s)
