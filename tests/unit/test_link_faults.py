"""TidemqCluster's per-link faults as pure state: which node's namespace holds which rules, and
the nfnetlink_queue messages the delaying process exchanges with the kernel (golden bytes from
linux/netfilter/nfnetlink_queue.h's layouts)."""

from __future__ import annotations

import struct

import pytest

from tidemq.testing import link_delay
from tidemq.testing.links import CHAIN, LinkFaults, NodePlan, script

pytestmark = pytest.mark.unit

IPS = {"zookeeper": "10.0.0.2", "nameserver-0": "10.0.0.3", "broker-a-0": "10.0.0.4",
       "broker-a-1": "10.0.0.5"}  # fmt: skip
ABLE = {name: name != "zookeeper" for name in IPS}


def test_a_cut_link_drops_both_directions_on_one_side_only() -> None:
    faults = LinkFaults()
    faults.cut("broker-a-1", "broker-a-0")
    master = faults.plan("broker-a-0", IPS, ABLE)
    assert master.rules == (("-d", "10.0.0.5", "-j", "DROP"), ("-s", "10.0.0.5", "-j", "DROP"))
    assert faults.plan("broker-a-1", IPS, ABLE).rules == ()  # one side holds it
    assert faults.plan("nameserver-0", IPS, ABLE).rules == ()  # others are untouched


def test_a_link_to_zookeeper_is_held_by_the_tidemq_side() -> None:
    faults = LinkFaults()
    faults.delay("zookeeper", "broker-a-0", 150)
    plan = faults.plan("broker-a-0", IPS, ABLE)
    assert plan.delays == {1: 150}
    queue = ("-j", "NFQUEUE", "--queue-num", "1", "--queue-bypass")
    assert plan.rules == (("-d", "10.0.0.2", *queue), ("-s", "10.0.0.2", *queue))
    with pytest.raises(ValueError, match="can hold link faults"):
        faults.plan("zookeeper", IPS, {"zookeeper": False, "broker-a-0": False})


def test_each_delayed_peer_gets_its_own_queue_and_a_cut_outranks_a_delay() -> None:
    faults = LinkFaults()
    faults.delay("broker-a-0", "broker-a-1", 50)
    faults.delay("broker-a-0", "nameserver-0", 20)
    faults.cut("broker-a-0", "nameserver-0")
    plan = faults.plan("broker-a-0", IPS, ABLE)
    assert plan.delays == {1: 50}
    assert ("-d", "10.0.0.3", "-j", "DROP") in plan.rules
    faults.heal("nameserver-0", "broker-a-0")
    faults.delay("broker-a-1", "broker-a-0", 0)  # 0 ends a delay
    assert faults.faults() == {}
    assert faults.plan("broker-a-0", IPS, ABLE) == NodePlan((), {})


def test_bad_links_are_refused() -> None:
    faults = LinkFaults()
    with pytest.raises(ValueError, match="to itself"):
        faults.cut("broker-a-0", "broker-a-0")
    with pytest.raises(ValueError, match=">= 0"):
        faults.delay("broker-a-0", "broker-a-1", -1)


def test_the_script_replaces_the_rules_and_waits_for_the_delayer() -> None:
    plan = NodePlan((("-d", "10.0.0.5", "-j", "DROP"),), {1: 25.5})
    text = script(plan)
    assert f"iptables -F {CHAIN}" in text  # rules replaced, not appended to
    assert f"iptables -A {CHAIN} -d 10.0.0.5 -j DROP" in text
    assert "link_delay 1=25.5 " in text and "until grep -q holding" in text
    healed = script(NodePlan((), {}))
    assert "link_delay" not in healed.replace("/tmp/link_delay.pid", "")
    assert "kill $(cat /tmp/link_delay.pid)" in healed  # the old delayer stops


def test_nfqueue_requests_match_the_kernel_layouts() -> None:
    bind, params, maxlen = link_delay.bind_messages(7)
    # nlmsghdr: length 28, type QUEUE<<8|CONFIG, flags REQUEST; nfgenmsg: AF_UNSPEC, v0, queue 7
    # (big-endian); attribute CFG_CMD (len 8): BIND, pad, pf 0.
    header = "1c00000002030100000000000000000000000007"
    assert bind == bytes.fromhex(header + "0800010001000000")
    # CFG_PARAMS: copy range 0, copy mode META, padded to 4 bytes.
    assert params[20:] == bytes.fromhex("090002000000000001000000")
    assert maxlen[20:] == bytes.fromhex("0800030000010000")
    verdict = link_delay.verdict(7, 0x01020304)
    # VERDICT_HDR: NF_ACCEPT, packet id, both big-endian.
    assert verdict[4:6] == struct.pack("=H", 3 << 8 | 1)
    assert verdict[20:] == bytes.fromhex("0c0002000000000101020304")


def packet_message(queue: int, packet_id: int) -> bytes:
    hdr = link_delay._attr(link_delay.NFQA_PACKET_HDR, struct.pack("!IHB", packet_id, 0x0800, 3))
    mark = link_delay._attr(3, b"\0\0\0\0")  # an attribute it skips
    body = link_delay.NFGENMSG.pack(2, 0, queue) + mark + hdr
    return link_delay.NLMSGHDR.pack(16 + len(body), 3 << 8, 0, 0, 0) + body


def test_queued_packets_are_read_from_one_buffer_of_several_messages() -> None:
    data = packet_message(1, 41) + packet_message(2, 42)
    assert list(link_delay.packets(data)) == [(1, 41), (2, 42)]
    error = link_delay.NLMSGHDR.pack(36, link_delay.NLMSG_ERROR, 0, 0, 0) + struct.pack("=i", -1)
    with pytest.raises(OSError, match="refused"):
        list(link_delay.packets(error + b"\0" * 16))
    assert link_delay.parse_args(["1=50", "2=0.5"]) == {1: 0.05, 2: 0.0005}
    with pytest.raises(SystemExit, match="QUEUE=DELAY_MS"):
        link_delay.parse_args(["50ms"])
