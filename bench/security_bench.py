"""Produce over TLS with authentication, beside plaintext, in the same run (docs/security.md;
goal: at least 0.8 of plaintext's msgs/s).

usage: python bench/security_bench.py [--runs 3] [--messages 200000] [--body-bytes 1024]

Per run, two fresh clusters of one nameserver and one ASYNC-flush broker (each its own process
on 127.0.0.1), one producer process (this one: the SDK's ``send_async`` batching, default
settings): ``plaintext``, then ``secured`` (TLS on every listener with a test CA made by
openssl, an ACL file, every request signed and checked against the producer's account, the
broker registering with the nameserver as an admin account). Each case reports msgs/s, the
broker's CPU per message and the producer's. Prints one JSON object per line, last a
``summary`` with medians and the ratio secured / plaintext.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

from common import REPO, emit, emit_summary
from receive_broker import BenchBroker, cpu_s

sys.path.insert(0, REPO)  # tests.tls_certs: the CA and certificates the tests use

from tests.tls_certs import TestCA
from tidemq.cli.bench import run_produce_bench
from tidemq.protos.signing import Credentials
from tidemq.protos.tls import TlsSettings

TOPIC = "SecurityBench"
ACL = """
accounts:
  - accessKey: ops
    secretKey: ops-secret
    admin: true
  - accessKey: producer
    secretKey: producer-secret
    topicPerms:
      - SecurityBench=PUB
      - TBW102=PUB
"""
OPS = Credentials("ops", "ops-secret")
PRODUCER = Credentials("producer", "producer-secret")


def _secured_args(d: Path) -> tuple[tuple[str, ...], tuple[str, ...], TlsSettings]:
    ca = TestCA(d / "pki")
    acl = d / "plain_acl.yml"
    acl.write_text(ACL)
    config = d / "broker.toml"
    config.write_text('access_key = "ops"\nsecret_key = "ops-secret"\n')

    def tls(cn: str) -> tuple[str, ...]:
        cert = ca.issue(cn)
        return (
            "--tls-cert-file", cert.cert_file, "--tls-key-file", cert.key_file,
            "--tls-ca-file", ca.ca_file, "--acl-file", str(acl),
        )  # fmt: skip

    broker = ("--config", str(config), *tls("broker:bench-receive:0"))
    return tls("nameserver"), broker, TlsSettings(ca_file=ca.ca_file)


def case(run: int, secured: bool, args: argparse.Namespace, scratch: str) -> dict[str, float]:
    name = "secured" if secured else "plaintext"
    d = Path(scratch) / f"run{run}-{name}"
    d.mkdir(parents=True)
    ns_args: tuple[str, ...] = ()
    broker_args: tuple[str, ...] = ()
    tls: TlsSettings | None = None
    settings: dict[str, Any] = {"tls": False, "credentials": False}
    if secured:
        ns_args, broker_args, tls = _secured_args(d)
        settings = {"tls": tls, "credentials": PRODUCER}
    with BenchBroker(
        str(d), str(d / "store"), extra_args=broker_args, nameserver_args=ns_args,
        tls=tls, credentials=OPS if secured else None,
    ) as broker:  # fmt: skip
        marks: dict[str, float] = {}

        def window(edge: str) -> None:
            marks[edge] = cpu_s(broker.pid)

        r = run_produce_bench(
            broker.nameserver, topic=TOPIC, messages=args.messages, body_bytes=args.body_bytes,
            progress=False, producer_settings=settings, on_window=window,
        )  # fmt: skip
        broker_us = (marks["end"] - marks["start"]) / args.messages * 1e6
        emit({**r, "bench": f"produce_{name}", "run": run,
              "broker_cpu_us_per_msg": round(broker_us, 2)})  # fmt: skip
    shutil.rmtree(d, ignore_errors=True)
    return {
        f"{name}_msgs_per_s": r["msgs_per_s"],
        f"{name}_broker_cpu_us_per_msg": broker_us,
        f"{name}_producer_cpu_us_per_msg": r["client_cpu_us_per_msg"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--messages", type=int, default=200_000)
    p.add_argument("--body-bytes", type=int, default=1024)
    args = p.parse_args()
    for var in [k for k in os.environ if k.startswith("TIDEMQ_")]:
        del os.environ[var]  # the cases say what the producer uses
    runs = []
    with tempfile.TemporaryDirectory(prefix="tidemq-security-bench-") as scratch:
        for run in range(args.runs):
            figures: dict[str, float] = {}
            for secured in (False, True):
                figures.update(case(run, secured, args, scratch))
            runs.append(figures)

    def ratio(r: dict[str, float]) -> dict[str, float]:
        return {"secured_vs_plaintext": r["secured_msgs_per_s"] / r["plaintext_msgs_per_s"]}

    def goals(_med: dict[str, float], ratios: dict[str, float]) -> dict[str, bool]:
        return {"secured_at_least_0.8_of_plaintext": ratios["secured_vs_plaintext"] >= 0.8}

    emit_summary(runs, ratio, goals)


if __name__ == "__main__":
    main()
