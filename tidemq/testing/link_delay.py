"""Hold packets for a while before the kernel sends them on: the latency half of
``TidemqCluster``'s per-link faults, run as root inside a node's network namespace::

    python -m tidemq.testing.link_delay QUEUE=DELAY_MS [QUEUE=DELAY_MS ...]

The cluster's iptables rules (``-j NFQUEUE --queue-num QUEUE --queue-bypass``) hand it the
packets of one link, in both directions; it answers each with ACCEPT after that queue's delay.
Packets stay in the kernel: only their ids cross (copy mode "meta"), so established connections
(gRPC channels, ZooKeeper sessions) slow down as they are, with nothing reset. The kernels these
tests run on lack ``sch_netem``, which is why this is not ``tc qdisc ... netem``.

It speaks nfnetlink_queue (linux/netfilter/nfnetlink_queue.h) with the standard library only:
the image that runs it has no libnetfilter_queue. If it dies, ``--queue-bypass`` lets the
packets through undelayed rather than cutting the link.
"""

from __future__ import annotations

import asyncio
import socket
import struct
import sys
from collections.abc import Iterator, Sequence

NETLINK_NETFILTER = 12
NFNL_SUBSYS_QUEUE = 3
NFQNL_MSG_PACKET = 0
NFQNL_MSG_VERDICT = 1
NFQNL_MSG_CONFIG = 2
NLM_F_REQUEST = 0x1
NLMSG_ERROR = 0x2
NFQA_PACKET_HDR = 1
NFQA_VERDICT_HDR = 2
NFQA_CFG_CMD = 1
NFQA_CFG_PARAMS = 2
NFQA_CFG_QUEUE_MAXLEN = 3
NFQNL_CFG_CMD_BIND = 1
NFQNL_COPY_META = 1
NF_ACCEPT = 1
# A delayed link holds delay x rate packets; the kernel's default of 1024 would overflow (and,
# with --queue-bypass, let packets through undelayed) at modest rates.
QUEUE_MAXLEN = 1 << 16

NLMSGHDR = struct.Struct("=IHHII")  # length, type, flags, seq, port id (host order)
NFGENMSG = struct.Struct("!BBH")  # family, version, resource id (the queue number)
NLATTR = struct.Struct("=HH")  # length, type


def _attr(kind: int, payload: bytes) -> bytes:
    raw = NLATTR.pack(NLATTR.size + len(payload), kind) + payload
    return raw + b"\0" * (-len(raw) % 4)


def message(msg_type: int, queue: int, attrs: bytes, seq: int = 0) -> bytes:
    """One nfnetlink_queue request to the kernel."""
    body = NFGENMSG.pack(socket.AF_UNSPEC, 0, queue) + attrs
    kind = (NFNL_SUBSYS_QUEUE << 8) | msg_type
    return NLMSGHDR.pack(NLMSGHDR.size + len(body), kind, NLM_F_REQUEST, seq, 0) + body


def bind_messages(queue: int) -> list[bytes]:
    """Take packets of ``queue``: their ids only, up to QUEUE_MAXLEN held at once."""
    settings = [
        (NFQA_CFG_CMD, struct.pack("!BxH", NFQNL_CFG_CMD_BIND, 0)),
        (NFQA_CFG_PARAMS, struct.pack("!IB", 0, NFQNL_COPY_META)),
        (NFQA_CFG_QUEUE_MAXLEN, struct.pack("!I", QUEUE_MAXLEN)),
    ]
    return [message(NFQNL_MSG_CONFIG, queue, _attr(kind, value)) for kind, value in settings]


def verdict(queue: int, packet_id: int) -> bytes:
    return message(
        NFQNL_MSG_VERDICT, queue, _attr(NFQA_VERDICT_HDR, struct.pack("!II", NF_ACCEPT, packet_id))
    )


def packets(data: bytes) -> Iterator[tuple[int, int]]:
    """(queue, packet id) of every queued packet in one read from the socket; a kernel error
    answer raises OSError."""
    at = 0
    while at + NLMSGHDR.size <= len(data):
        length, kind, _flags, _seq, _pid = NLMSGHDR.unpack_from(data, at)
        if length < NLMSGHDR.size:
            return
        end = at + length
        if kind == NLMSG_ERROR:
            (errno,) = struct.unpack_from("=i", data, at + NLMSGHDR.size)
            if errno:
                raise OSError(-errno, "nfnetlink_queue refused a request")
        elif kind == (NFNL_SUBSYS_QUEUE << 8) | NFQNL_MSG_PACKET:
            _family, _version, queue = NFGENMSG.unpack_from(data, at + NLMSGHDR.size)
            pos = at + NLMSGHDR.size + NFGENMSG.size
            while pos + NLATTR.size <= end:
                alen, atype = NLATTR.unpack_from(data, pos)
                if alen < NLATTR.size:
                    break
                if atype & 0x7FFF == NFQA_PACKET_HDR:
                    (packet_id,) = struct.unpack_from("!I", data, pos + NLATTR.size)
                    yield queue, packet_id
                pos += alen + (-alen % 4)
        at = end + (-length % 4)


def parse_args(argv: Sequence[str]) -> dict[int, float]:
    """``QUEUE=DELAY_MS`` pairs as queue -> delay in seconds."""
    delays: dict[int, float] = {}
    for arg in argv:
        queue, sep, delay_ms = arg.partition("=")
        if not sep or not queue.isdigit() or not delay_ms.replace(".", "", 1).isdigit():
            raise SystemExit(f"usage: link_delay QUEUE=DELAY_MS ...; not {arg!r}")
        delays[int(queue)] = float(delay_ms) / 1000
    if not delays:
        raise SystemExit("usage: link_delay QUEUE=DELAY_MS ...")
    return delays


async def run(delays: dict[int, float]) -> None:
    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_NETFILTER)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 8 << 20)
    sock.bind((0, 0))
    for queue in delays:
        for request in bind_messages(queue):
            sock.send(request)
    sock.setblocking(False)
    loop = asyncio.get_running_loop()

    def release(queue: int, packet_id: int) -> None:
        try:
            sock.send(verdict(queue, packet_id))
        except BlockingIOError:  # the kernel's buffer is full: try again in a moment
            loop.call_later(0.001, release, queue, packet_id)

    def readable() -> None:
        while True:
            try:
                data = sock.recv(1 << 16)
            except BlockingIOError:
                return
            except OSError as e:  # ENOBUFS: the kernel dropped notices; those packets go too
                print(f"link_delay: {e}", file=sys.stderr, flush=True)
                continue
            for queue, packet_id in packets(data):
                loop.call_later(delays.get(queue, 0.0), release, queue, packet_id)

    loop.add_reader(sock.fileno(), readable)
    print(f"link_delay: holding queues {sorted(delays)}", file=sys.stderr, flush=True)
    await asyncio.Event().wait()


def main(argv: Sequence[str] | None = None) -> None:
    asyncio.run(run(parse_args(sys.argv[1:] if argv is None else argv)))


if __name__ == "__main__":
    main()
