"""``tidemq dev``: a local cluster on loopback for trying tidemq, and what ``make run`` starts.

A nameserver on the embedded registry and one broker group of a master and a slave (the slave
replicates the master's CommitLog and copies its topics, groups and offsets), each a child
process logging to ``DATA/logs``, the stores under ``DATA/broker-a`` and ``DATA/broker-a-s1``.
Ctrl-C (or SIGTERM) stops the slave, then the master, so each unregisters and closes its store
cleanly, then the nameserver. Restarting with the same ``--data`` keeps every message, topic and
consumer offset.
"""

from __future__ import annotations

import argparse
import ctypes
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import grpc

from tidemq.protos import broker_pb2, broker_pb2_grpc, nameserver_pb2, nameserver_pb2_grpc

START_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 20.0
PR_SET_PDEATHSIG = 1
DIE_WITH_PARENT_ENV = "TIDEMQ_DIE_WITH_PARENT"


class DevError(Exception):
    """The local cluster cannot start; one line for the user."""


@dataclass
class Child:
    name: str
    proc: subprocess.Popen[bytes]
    log: Path | None  # None: it writes to our own output

    def tail(self, lines: int = 20) -> str:
        if self.log is None:
            return "(see the output above)"
        text = self.log.read_text(errors="replace").splitlines()
        return "\n".join(text[-lines:])

    @property
    def where(self) -> str:
        return str(self.log) if self.log is not None else "the output above"


def die_with_parent() -> None:
    """In a child of ``tidemq dev`` (it sets DIE_WITH_PARENT_ENV to its pid; the nameserver and
    broker commands call this first): exit when the parent dies, even by SIGKILL or a closed
    terminal, instead of holding the ports.

    Done in the child rather than in ``preexec_fn``, which is unsafe in a process with threads
    (gRPC's). Linux only; elsewhere children outlive a killed parent and are stopped by hand.
    """
    parent = os.environ.pop(DIE_WITH_PARENT_ENV, "")
    if not parent.isdigit():
        return
    try:
        libc = ctypes.CDLL("libc.so.6", use_errno=True)
    except OSError:
        return
    libc.prctl(PR_SET_PDEATHSIG, signal.SIGTERM)
    if os.getppid() != int(parent):  # it died before prctl took effect
        sys.exit(1)


def _port_free(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def _spawn(name: str, args: list[str], log: Path | None) -> Child:
    """Start ``tidemq ARGS`` logging to ``log``, or to our own output when None (a container,
    whose engine collects it)."""
    with log.open("ab") if log is not None else open(os.devnull, "wb") as f:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli", *args],
            stdout=f if log is not None else None,
            stderr=subprocess.STDOUT if log is not None else None,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # Ctrl-C reaches only us; we stop the children in order
            env={**os.environ, DIE_WITH_PARENT_ENV: str(os.getpid())},
        )
    return Child(name, proc, log)


def _wait_serving(child: Child, ready: Callable[[], bool], deadline: float) -> None:
    """Until ``ready()`` says so (an RPC error means not yet), the child dies, or the deadline."""
    while True:
        if child.proc.poll() is not None:
            raise DevError(
                f"{child.name} exited with {child.proc.returncode} while starting; "
                f"its log ({child.where}) ends with:\n{child.tail()}"
            )
        try:
            if ready():
                return
        except grpc.RpcError:
            pass
        if time.monotonic() > deadline:
            raise DevError(
                f"{child.name} not serving after {START_TIMEOUT_S:.0f} s; see {child.where}"
            )
        time.sleep(0.1)


def _stop(child: Child) -> None:
    if child.proc.poll() is None:
        child.proc.send_signal(signal.SIGTERM)
        try:
            child.proc.wait(STOP_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            print(f"{child.name} did not stop in {STOP_TIMEOUT_S:.0f} s; killing it", flush=True)
            child.proc.kill()
            child.proc.wait()


def run(args: argparse.Namespace) -> int:
    data = Path(args.data).resolve()
    logs = data / "logs"
    logs.mkdir(parents=True, exist_ok=True)

    def log_of(name: str) -> Path | None:
        return None if args.logs_to_stdout else logs / f"{name}.log"

    # Servers listen on ``--bind``; this process and the servers reach each other on loopback,
    # and clients reach the master where ``--advertise`` says (a container's mapped ports).
    host = "127.0.0.1"
    bind = args.bind
    ns_addr = f"{host}:{args.nameserver_port}"
    broker_addr = f"{host}:{args.broker_port}"
    slave_addr = f"{host}:{args.slave_port}"
    ports = [("nameserver", args.nameserver_port), ("broker", args.broker_port)]
    if args.slave_port:
        ports.append(("slave", args.slave_port))
    if args.console_port:
        ports.append(("console", args.console_port))
    # The RocketMQ 5 listeners (official clients): the master's port, the slave's the next one.
    v2_ports: dict[str, int] = {}
    if args.rocketmq_port:
        v2_ports["broker-a"] = args.rocketmq_port
        if args.slave_port:
            v2_ports["broker-a-s1"] = args.rocketmq_port + 1
        ports += [("rocketmq", port) for port in v2_ports.values()]
    for what, port in ports:
        if not _port_free(bind, port):
            print(
                f"tidemq dev: port {port} ({what}) is in use; is another cluster running? "
                f"Choose others with --{what}-port.",
                file=sys.stderr,
            )
            return 1

    stop_requested = False

    def request_stop(signum: int, frame: object) -> None:
        nonlocal stop_requested
        stop_requested = True

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    children: list[Child] = []
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        ns_listen = f"{bind}:{args.nameserver_port}"
        ns = _spawn("nameserver", ["nameserver", "--listen", ns_listen], log_of("nameserver"))
        children.append(ns)
        with grpc.insecure_channel(ns_addr) as ch:
            stub = nameserver_pb2_grpc.NameServerStub(ch)
            _wait_serving(
                ns,
                lambda: stub.GetStatus(nameserver_pb2.GetStatusRequest(), timeout=1) is not None,
                deadline,
            )
        common = ["--cluster", "DevCluster", "--broker-name", "broker-a", "--nameserver", ns_addr]
        if args.store_overrides:
            common += ["--store-overrides", args.store_overrides]
        master_args = ["--role", args.role, "--auto-create-topics", "--flush", args.flush]
        brokers = [("broker-a", broker_addr, [*common, *master_args])]
        if args.slave_port:
            slave_args = ["--role", "SLAVE", "--broker-id", "1", "--flush", args.flush]
            brokers.append(("broker-a-s1", slave_addr, [*common, *slave_args]))
        for name, address, flags in brokers:
            port = address.rpartition(":")[2]
            master = name == "broker-a"
            advertise = args.advertise if master and args.advertise else address
            listen = ["--listen", f"{bind}:{port}", "--advertise", advertise]
            v2: list[str] = []
            if name in v2_ports:
                v2_advertise = f"{host}:{v2_ports[name]}"
                if master and args.rocketmq_advertise:
                    v2_advertise = args.rocketmq_advertise
                v2 = ["--rocketmq-listen", f"{bind}:{v2_ports[name]}"]
                v2 += ["--rocketmq-advertise", v2_advertise]
            store = str(data / name)
            child = _spawn(name, ["broker", *listen, "--store", store, *flags, *v2], log_of(name))
            children.append(child)
            _wait_broker(child, address, deadline)
        with grpc.insecure_channel(ns_addr) as ch:
            stub = nameserver_pb2_grpc.NameServerStub(ch)
            # Ready means routable: every broker's first registration reached the nameserver.
            _wait_serving(
                ns,
                lambda: (
                    stub.GetStatus(nameserver_pb2.GetStatusRequest(), timeout=1).brokers
                    >= len(brokers)
                ),
                deadline,
            )
        console_url = ""
        if args.console_port:
            console_url = f"http://{host}:{args.console_port}/"
            console = _spawn(
                "console",
                ["console", "--nameserver", ns_addr, "--listen", f"{bind}:{args.console_port}"],
                log_of("console"),
            )
            children.append(console)
            _wait_serving(console, lambda: _http_ok(console_url + "healthz"), deadline)
        v2_addr = f"{host}:{args.rocketmq_port}" if args.rocketmq_port else ""
        _print_banner(
            data,
            ns_addr,
            broker_addr,
            slave_addr if args.slave_port else "",
            v2_addr,
            console_url,
            args,
        )
        while not stop_requested:
            for c in children:
                if c.proc.poll() is not None:
                    raise DevError(
                        f"{c.name} exited with {c.proc.returncode}; its log ({c.where}) ends "
                        f"with:\n{c.tail()}"
                    )
            time.sleep(0.2)
    except DevError as e:
        print(f"tidemq dev: {e}", file=sys.stderr)
        return 1
    finally:
        if stop_requested:
            print(
                "\nstopping: brokers first, slave then master (flush, checkpoint, unregister), "
                "then the nameserver"
            )
        for c in reversed(children):
            _stop(c)
        if children and stop_requested:
            print(f"stopped; data kept in {data}", flush=True)
    return 0


def _http_ok(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=1) as r:
            return bool(r.status == 200)
    except OSError:
        return False


def _wait_broker(child: Child, address: str, deadline: float) -> None:
    with grpc.insecure_channel(address) as ch:
        stub = broker_pb2_grpc.BrokerStub(ch)
        _wait_serving(
            child,
            lambda: (
                stub.GetBrokerStatus(broker_pb2.GetBrokerStatusRequest(), timeout=1) is not None
            ),
            deadline,
        )


def _print_banner(
    data: Path,
    ns_addr: str,
    broker_addr: str,
    slave_addr: str,
    v2_addr: str,
    console_url: str,
    args: argparse.Namespace,
) -> None:
    slave_line = f"\n  broker-a/1   {slave_addr}  SLAVE of broker-a" if slave_addr else ""
    if v2_addr:
        slave_line += f"\n  RocketMQ 5   {v2_addr}   endpoints for the official RocketMQ clients"
    if console_url:
        slave_line += f"\n  console      {console_url}   the web console"
    exe = "tidemq"
    venv_exe = Path(sys.executable).parent / "tidemq"
    if venv_exe.exists() and str(venv_exe.parent) not in os.environ.get("PATH", "").split(":"):
        exe = os.path.relpath(venv_exe)
    print(
        f"""tidemq dev cluster is up (Ctrl-C stops it; data and logs in {data})
  nameserver   {ns_addr}   (embedded registry)
  broker-a     {broker_addr}  {args.role} of cluster DevCluster, {args.flush} flush, \
topics auto-created{slave_line}

Try, in another terminal:
  {exe} send orders 'hello tidemq' --tag created --key order-1
  {exe} consume orders --group demo --max 10
  {exe} receive orders --group billing --count 10   (receive and ack each message)
  {exe} send reminders 'call back' --delay 30s      (delivered in 30 s)
  {exe} delayed list                                (pending; cancel with: delayed cancel)
  {exe} transactions list                           (open transactions)
  {exe} topic describe orders --group demo
  {exe} cluster status
  {exe} bench produce --messages 50000
""",
        flush=True,
    )


def add_parser(sub: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """``tidemq dev`` (the ``tidemq.commands`` entry point)."""
    p = sub.add_parser("dev", help="run a local cluster (nameserver, master, slave) on loopback")
    p.add_argument("--data", default=".tidemq-dev", help="data and logs (default .tidemq-dev)")
    p.add_argument("--nameserver-port", type=int, default=9876)
    p.add_argument("--broker-port", type=int, default=10911)
    p.add_argument("--slave-port", type=int, default=10912, help="the slave's port (0: no slave)")
    p.add_argument(
        "--console-port", type=int, default=8080, help="the web console's port (0: no console)"
    )
    p.add_argument(
        "--role",
        choices=["ASYNC_MASTER", "SYNC_MASTER"],
        default="ASYNC_MASTER",
        help="the master's replication role (SYNC_MASTER answers once the slave has a send)",
    )
    p.add_argument("--flush", choices=["ASYNC", "SYNC"], default="ASYNC")
    p.add_argument(
        "--rocketmq-port",
        type=int,
        default=8081,
        help="the master's RocketMQ 5 listener for the official clients; the slave's is the "
        "next port (0: none)",
    )
    p.add_argument("--store-overrides", help="JSON object of StoreConfig keys (e.g. smaller files)")
    p.add_argument(
        "--bind",
        default="127.0.0.1",
        help="the address every server listens on (default loopback; 0.0.0.0 in a container)",
    )
    p.add_argument(
        "--advertise",
        help="HOST:PORT clients reach the master at, if not its own port on loopback (a "
        "container's host-mapped port)",
    )
    p.add_argument(
        "--rocketmq-advertise",
        help="HOST:PORT the official clients reach the master's RocketMQ 5 listener at",
    )
    p.add_argument(
        "--logs-to-stdout",
        action="store_true",
        help="the servers log to this command's output instead of DATA/logs (a container's)",
    )
    p.set_defaults(func=run)
