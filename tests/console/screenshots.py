"""The pictures of docs/console.md, made from a real cluster: ``python -m tests.console.screenshots
docs/images``. Starts ``tidemq dev`` (its own ports, a scratch directory), sends and consumes
so every page has something to show (a group that falls behind and catches up, a message
redelivered then acked, a dead letter, a delayed message), runs a console sampling every second
and saves each page as ``console-<page>.png`` through Debian's Chromium."""

from __future__ import annotations

import argparse
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from playwright.sync_api import sync_playwright

import tidemq
from tests.console.harness import CHROMIUM, CHROMIUM_ARGS
from tests.integration.conftest import free_port
from tests.waiting import wait_until
from tidemq.consumer import SimpleConsumer, SimpleConsumerConfig


def _dev(data: Path) -> tuple[subprocess.Popen[bytes], str, str]:
    ns, console = free_port(), free_port()
    log = data / "dev.out"
    with log.open("wb") as out:
        proc = subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli", "dev", "--data", str(data / "dev"),
             "--nameserver-port", str(ns), "--broker-port", str(free_port()),
             "--slave-port", str(free_port()), "--rocketmq-port", "0",
             "--console-port", str(console)],
            stdout=out, stderr=subprocess.STDOUT,
        )  # fmt: skip
    wait_until(lambda: "cluster is up" in log.read_text(), 60, "tidemq dev")
    return proc, f"127.0.0.1:{ns}", f"http://127.0.0.1:{console}/"


def _traffic(ns: str) -> str:
    with tidemq.Admin(ns) as admin:
        admin.create_topic("orders", queues=4)
        admin.create_topic("payments", queues=2)
        admin.update_consumer_group("billing", max_delivery_attempts=2, retry_delays_s=[1.0])
    with tidemq.Producer(ns) as producer:
        for i in range(400):
            producer.send_async(
                "orders", f'{{"order": {i}, "total": {i * 3}}}', keys=[f"order-{i}"]
            )
            producer.send_async("payments", f"payment {i}")
        producer.send("orders", "call back later", keys=["reminder-1"], delay=3600)
        watched = producer.send("orders", '{"order": 4242, "total": 99}', keys=["order-4242"])
    config = SimpleConsumerConfig(start_from="first", client_id="billing-worker-1")
    acked_watched = dead = False
    with SimpleConsumer("billing", "orders", nameserver=ns, config=config) as receiver:
        deadline = time.monotonic() + 90
        while not (acked_watched and dead) and time.monotonic() < deadline:
            for m in receiver.receive(64, 1.0, timeout_s=1.0):
                if m.msg_id == watched.msg_id and m.delivery_attempt == 1:
                    continue  # left to lapse: delivered again, then acked
                if m.keys == ("order-13",):
                    receiver.nack(m)  # fails twice: dead-lettered
                    dead = dead or m.delivery_attempt == 2
                    continue
                receiver.ack(m)
                acked_watched = acked_watched or m.msg_id == watched.msg_id
    return watched.msg_id


def _lagging(ns: str, seconds: float) -> None:
    """A pull group that falls behind for a while, then catches up."""
    with tidemq.Consumer(ns, group="analytics", topic="payments", start_from="first") as c:
        c.poll(max_messages=10, timeout_s=5)
        c.commit()
        with tidemq.Producer(ns) as producer:
            end = time.monotonic() + seconds
            while time.monotonic() < end:
                for i in range(50):
                    producer.send_async("payments", f"payment burst {i}")
                time.sleep(0.5)  # paced traffic for the picture, not a wait on a condition
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            c.poll(max_messages=40, timeout_s=0.5)
            c.commit()


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("out", type=Path)
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix="tidemq-screenshots-") as scratch:
        dev, ns, _ = _dev(Path(scratch))
        port = free_port()
        console = subprocess.Popen(
            [sys.executable, "-m", "tidemq.cli", "console", "--nameserver", ns,
             "--listen", f"127.0.0.1:{port}", "--sample-interval-s", "1"],
            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        url = f"http://127.0.0.1:{port}"
        try:
            watched = _traffic(ns)
            _lagging(ns, 20)
            with sync_playwright() as pw:
                browser = pw.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
                page = browser.new_page(viewport={"width": 1280, "height": 860})
                shots = {
                    "cluster": "/",
                    "topics": "/topics",
                    "topic": "/topics/orders",
                    "group": "/groups/analytics",
                    "receive-group": "/groups/billing",
                    "message": f"/messages/{watched}",
                    "search": "/messages?topic=orders&key=order-4242",
                    "dlq": "/dlq/billing",
                    "pending": "/pending",
                }
                for name, path in shots.items():
                    page.goto(url + path)
                    page.wait_for_function(
                        "() => Array.from(document.querySelectorAll('figure.chart'))"
                        ".every((f) => f.dataset.state)"
                    )
                    page.screenshot(path=str(args.out / f"console-{name}.png"), full_page=True)
                    print(name, re.sub(r"\s+", " ", page.title()))
                browser.close()
        finally:
            console.terminate()
            console.wait(10)
            dev.terminate()
            dev.wait(30)


if __name__ == "__main__":
    main()
