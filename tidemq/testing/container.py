"""``TidemqContainer``: a nameserver and a broker in one container, for an application's tests,
as testcontainers' KafkaContainer is for Kafka's.

The container runs ``standalone`` (tidemq.entrypoint): a nameserver on the embedded registry and
one master broker that creates topics on first use. Everything is reached through host-mapped
ports, so it works wherever testcontainers does (Docker Desktop on macOS and Windows as well as
a Linux engine). Those ports are known only once the container runs, and the broker must
advertise them (clients go where the routes say); so the container waits for a small file
naming them, which ``start`` copies in.
"""

from __future__ import annotations

import io
import os
import tarfile
import time
import uuid
from types import TracebackType
from typing import Any

import grpc
from testcontainers.core.container import DockerContainer

from tidemq import health
from tidemq.admin import Admin
from tidemq.consumer import Consumer
from tidemq.producer import Producer
from tidemq.protos import nameserver_pb2, nameserver_pb2_grpc
from tidemq.testing.config import DEFAULT_IMAGE, IMAGE_ENV, LABEL, RUN_LABEL_ENV
from tidemq.testing.node import wait_for

NAMESERVER_PORT = 9876
BROKER_PORT = 10911
ROCKETMQ_PORT = 8081
# Read by the image's entrypoint (ADVERTISE_FILE_ENV); /tmp is the only place the container's
# user may write outside the store.
ADVERTISE_FILE = "/tmp/tidemq-advertise.toml"


class TidemqContainer(DockerContainer):
    """A nameserver and a master broker in one container.

    ::

        with TidemqContainer() as tidemq:
            producer = Producer(tidemq.get_nameserver_address())

    ``get_nameserver_address()`` is what the SDK and the CLI take; ``get_rocketmq_endpoint()``
    what an official RocketMQ 5 client takes as its endpoints. ``image`` defaults to
    ``TIDEMQ_TEST_IMAGE`` or the published image of this tidemq version.
    """

    def __init__(
        self, image: str | None = None, *, start_timeout_s: float = 60, **kwargs: Any
    ) -> None:
        super().__init__(image or os.environ.get(IMAGE_ENV) or DEFAULT_IMAGE, **kwargs)
        self.start_timeout_s = start_timeout_s
        self.with_exposed_ports(NAMESERVER_PORT, BROKER_PORT, ROCKETMQ_PORT)
        self.with_command(["standalone"])
        self.with_env("TIDEMQ_ADVERTISE_FILE", ADVERTISE_FILE)
        labels = {LABEL: uuid.uuid4().hex[:8], f"{LABEL}.run": os.environ.get(RUN_LABEL_ENV, "")}
        self.with_kwargs(labels=labels)
        self.started_in_s: float | None = None

    def __enter__(self) -> TidemqContainer:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def start(self) -> TidemqContainer:
        """Start it and return once the broker is routable through the mapped ports."""
        began = time.monotonic()
        super().start()
        try:
            self._advertise()
            self._wait_routable()
        except BaseException:
            self.stop()
            raise
        self.started_in_s = time.monotonic() - began
        return self

    def _advertise(self) -> None:
        toml = (
            f'advertise = "{self.get_broker_address()}"\n'
            f'rocketmq_advertise = "{self.get_rocketmq_endpoint()}"\n'
        ).encode()
        staged = ADVERTISE_FILE + ".part"
        archive = io.BytesIO()
        with tarfile.open(fileobj=archive, mode="w") as tar:
            info = tarfile.TarInfo(os.path.basename(staged))
            info.size, info.mode = len(toml), 0o644
            tar.addfile(info, io.BytesIO(toml))
        wrapped = self.get_wrapped_container()
        wrapped.put_archive(os.path.dirname(staged), archive.getvalue())
        # A rename, so the entrypoint never reads half a file.
        code, out = wrapped.exec_run(["mv", staged, ADVERTISE_FILE], user="root")
        if code != 0:
            raise RuntimeError(f"could not hand the container its addresses: {out!r}")

    def _wait_routable(self) -> None:
        address = self.get_nameserver_address()

        def routable() -> bool:
            wrapped = self.get_wrapped_container()
            wrapped.reload()
            if wrapped.status in ("exited", "dead"):
                out, err = self.get_logs()
                raise RuntimeError(
                    "the tidemq container exited while starting:\n"
                    + (out + err).decode(errors="replace")[-4000:]
                )
            if health.check(self.get_broker_address(), timeout_s=1.0) != "SERVING":
                return False
            try:
                with grpc.insecure_channel(address) as channel:
                    status = nameserver_pb2_grpc.NameServerStub(channel).GetStatus(
                        nameserver_pb2.GetStatusRequest(), timeout=1
                    )
            except grpc.RpcError:
                return False
            return bool(status.brokers >= 1)

        wait_for(routable, self.start_timeout_s, "the tidemq container's broker to be routable")

    def _mapped(self, port: int) -> str:
        return f"{self.get_container_host_ip()}:{self.get_exposed_port(port)}"

    def get_nameserver_address(self) -> str:
        """``HOST:PORT`` of the nameserver: what the SDK, the CLI and Spark take."""
        return self._mapped(NAMESERVER_PORT)

    def get_broker_address(self) -> str:
        """``HOST:PORT`` of the broker, as the routes name it."""
        return self._mapped(BROKER_PORT)

    def get_rocketmq_endpoint(self) -> str:
        """``HOST:PORT`` of the broker's RocketMQ 5 listener: an official RocketMQ 5 client's
        ``endpoints``."""
        return self._mapped(ROCKETMQ_PORT)

    def producer(self, **settings: Any) -> Producer:
        return Producer(self.get_nameserver_address(), **settings)

    def consumer(self, group: str, topic: str, **settings: Any) -> Consumer:
        return Consumer(self.get_nameserver_address(), group=group, topic=topic, **settings)

    def admin(self) -> Admin:
        return Admin(self.get_nameserver_address())
