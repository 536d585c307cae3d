"""Automatic failover benchmark: how long a broker group takes to acknowledge writes again after
its master dies, and how long a planned switchover refuses sends.

usage: python bench/failover_bench.py [--kills 10] [--switchovers 5] [--session-ms 4000]

One ZooKeeper (Debian's package, standalone, tickTime 500 ms), one nameserver on it, and brokers
1-3 of group ``bench-a`` with ``--failover auto`` (SYNC_MASTER when elected, ZooKeeper session
``--session-ms``, lease 1 s), each its own process on 127.0.0.1. A probe thread sends one message
at a time through the SDK the whole run and records the time of every SEND_OK and its epoch.

- ``kill``, repeated ``--kills`` times: SIGKILL the master; the failover time is from the kill
  to the first SEND_OK at a newer epoch. Then the loss check: every message acknowledged so far
  must be readable from the new master at the queue and offset its SEND_OK named, with its body
  (within 30 s, as the confirm offset catches up); each kill's line reports ``acknowledged`` and
  ``lost``. The killed broker is restarted and the next round waits until all three are in sync
  again.
- ``switchover``, repeated ``--switchovers`` times: ``Admin.switchover`` to another in-sync
  broker; the refused window is the longest gap between two SEND_OKs around the call (what a
  sender saw), beside the master's own ``writes_paused_ms``.

Prints one JSON object per measurement, then a ``summary``: median and max of each, the session
timeout beside them, kills that lost nothing, and the goals (failover median <= session timeout
+ 2 s; switchover window < 1 s; no acknowledged message lost). A lost acknowledged message is a
failure, not a figure: the run says so on stderr and exits 1. Every process started is stopped at
the end, also on failure.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import shutil
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import grpc
from common import REPO, emit, failure, wait_until

sys.path.insert(0, REPO)

from failover_cluster import GROUP, LEASE_MS, PROBE_TOPIC, Cluster, Probe, Stored

import tidemq


def more_sends(cluster: Cluster, probe: Probe, n: int, what: str) -> None:
    before = len(probe.oks)
    wait_until(
        lambda: probe.check() and len(probe.oks) > before + n, what, cluster.procs(), timeout_s=120
    )


def lost_after_failover(cluster: Cluster, probe: Probe, timeout_s: float = 30) -> list[Stored]:
    """Acknowledged messages the new master does not serve where their SEND_OK said (empty when
    none is lost). Waits up to ``timeout_s`` for them, since what a slave holds becomes readable
    on the new master as its confirm offset catches up."""
    deadline = time.monotonic() + timeout_s
    while True:
        acked = probe.acknowledged()
        m = cluster.acknowledging_master()
        missing = acked
        if m is not None:
            with contextlib.suppress(grpc.RpcError):
                served = cluster.stored(m, PROBE_TOPIC)
                missing = [a for a in acked if a not in served]
        if not missing or time.monotonic() > deadline:
            return missing
        time.sleep(0.2)


def kill_round(cluster: Cluster, probe: Probe, n: int) -> tuple[float, int]:
    """SIGKILL the master; (seconds until the first SEND_OK at a newer epoch, acknowledged
    messages the new master lost)."""
    m, epoch = cluster.master()
    more_sends(cluster, probe, 20, "sends before the kill")
    killed_at = time.monotonic()
    cluster.brokers[m].proc.send_signal(signal.SIGKILL)
    cluster.brokers[m].proc.wait()
    live = [b for i, b in cluster.brokers.items() if i != m]
    wait_until(
        lambda: probe.first_ok_after(killed_at, epoch) is not None,
        "a SEND_OK from the new master",
        [cluster.nameserver, *live],
        timeout_s=120,
    )
    took = probe.first_ok_after(killed_at, epoch)
    assert took is not None
    seconds = took - killed_at
    failed = [f"+{at - killed_at:.2f}s {what}" for at, what in probe.errors if at > killed_at - 5]
    failed = failed[:10] + ([f"... {len(failed) - 10} more"] if len(failed) > 10 else [])
    lost = lost_after_failover(cluster, probe)
    emit(
        {
            "bench": "failover.kill",
            "round": n,
            "killed": m,
            "seconds": round(seconds, 3),
            "acknowledged": len(probe.acknowledged()),
            "lost": len(lost),
            "lost_examples": [list(a) for a in lost[:5]],
            "failed_sends": failed,
        }
    )
    if lost:
        print(
            f"failover benchmark: kill {n} of broker {m} lost {len(lost)} acknowledged "
            f"messages, e.g. {lost[:5]}",
            file=sys.stderr,
        )
    cluster.start(m)
    return seconds, len(lost)


def switch_round(
    cluster: Cluster, probe: Probe, admin: tidemq.Admin, n: int
) -> tuple[float, float]:
    """A switchover; (longest gap between SEND_OKs around it, the master's writes_paused)."""
    m, _ = cluster.master()
    target = min(i for i in cluster.brokers if i != m)
    start = time.monotonic()
    result = admin.switchover(GROUP, target)
    more_sends(cluster, probe, 20, "sends after the switch")
    window = probe.longest_gap(start - 1, time.monotonic())
    emit(
        {
            "bench": "failover.switchover",
            "round": n,
            "to": target,
            "refused_window_s": round(window, 3),
            "writes_paused_ms": result["writes_paused_ms"],
        }
    )
    return window, result["writes_paused_ms"] / 1000


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--kills", type=int, default=10)
    p.add_argument("--switchovers", type=int, default=5)
    p.add_argument("--session-ms", type=int, default=4_000)
    p.add_argument("--keep", action="store_true", help="keep the scratch directory and its logs")
    args = p.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tidemq-failover-bench-"))
    cluster = Cluster(work, args.session_ms)
    probe: Probe | None = None
    failovers: list[float] = []
    losses: list[int] = []  # acknowledged messages lost, per kill
    windows: list[float] = []
    paused: list[float] = []
    try:
        cluster.master()
        probe = Probe(cluster.ns_address)
        probe.start()
        more_sends(cluster, probe, 20, "the probe's first sends")
        for n in range(args.kills):
            seconds, lost = kill_round(cluster, probe, n)
            failovers.append(seconds)
            losses.append(lost)
        with tidemq.Admin(cluster.ns_address) as admin:
            for n in range(args.switchovers):
                window, pause = switch_round(cluster, probe, admin, n)
                windows.append(window)
                paused.append(pause)
    except Exception as e:
        raise failure(f"failover benchmark: {e}", cluster.procs()) from e
    finally:
        if probe is not None:
            probe.stopping.set()
            probe.finish(30)
        cluster.stop()
        if args.keep:
            print(f"logs kept in {work}", file=sys.stderr)
        else:
            shutil.rmtree(work, ignore_errors=True)
    session_s = args.session_ms / 1000
    summary: dict[str, Any] = {
        "bench": "summary",
        "session_timeout_s": session_s,
        "lease_s": LEASE_MS / 1000,
        "load1": round(os.getloadavg()[0], 2),
    }
    if failovers:
        summary["failover_s"] = {
            "kills": len(failovers),
            "median": round(statistics.median(failovers), 3),
            "max": round(max(failovers), 3),
            "clean_kills": sum(1 for lost in losses if lost == 0),
            "lost_acknowledged": sum(losses),
        }
    if windows:
        summary["switchover_refused_window_s"] = {
            "switchovers": len(windows),
            "median": round(statistics.median(windows), 3),
            "max": round(max(windows), 3),
            "writes_paused_median_s": round(statistics.median(paused), 3),
        }
    summary["goals"] = {
        "failover_median_le_session_plus_2s": bool(failovers)
        and statistics.median(failovers) <= session_s + 2,
        "switchover_window_lt_1s": bool(windows) and max(windows) < 1.0,
        "no_acknowledged_message_lost": not any(losses),
    }
    emit(summary)
    if any(losses):
        print(
            f"failover benchmark: FAILED, {sum(losses)} acknowledged messages lost in "
            f"{sum(1 for lost in losses if lost)} of {len(losses)} kills",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
