"""The web console in a real browser (Debian's Chromium driven by Playwright) against a real
nameserver and broker: every page loads without a console error, the lag chart follows a group
falling behind and catching up, a message found by key shows its deliveries, a dead letter is
resent from the DLQ page, and only a signed-in admin can delete a topic (after confirming)."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any

import pytest

import tidemq
from tests.console.harness import Browser, ConsoleProcess
from tests.integration.accounts import OPS, broker_config_as_ops, write_acl
from tests.integration.conftest import NameServerProcess, StartBroker, StartNameServer
from tests.waiting import wait_until
from tidemq.consumer import SimpleConsumer, SimpleConsumerConfig

pytestmark = pytest.mark.integration

TOPIC = "orders"


def _cluster(
    start_nameserver: StartNameServer, start_broker: StartBroker, *flags: str
) -> NameServerProcess:
    ns = start_nameserver()
    start_broker("--nameserver", ns.address, "--register-interval-ms", "500", *flags)
    with tidemq.Admin(ns.address) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "the broker registered")
        admin.create_topic(TOPIC, queues=2)
    return ns


def _open(b: Browser, console: ConsoleProcess, path: str) -> Any:
    response = b.page.goto(console.url.rstrip("/") + path)
    assert response is not None
    return response


def _chart_values(b: Browser, key_title: str) -> list[list[float | None]]:
    """The y columns the uPlot chart titled ``key_title`` is drawing now."""
    values: list[list[float | None]] = b.page.evaluate(
        """(title) => {
            const f = Array.from(document.querySelectorAll("figure.chart"))
                .find((f) => f.dataset.title === title);
            return f && f.plot ? f.plot.data.slice(1) : [];
        }""",
        key_title,
    )
    return values


def _charts_settled(b: Browser) -> None:
    """Until every chart on the page has drawn from its series (or found it empty)."""
    states = (
        "() => Array.from(document.querySelectorAll('figure.chart')).map((f) => f.dataset.state)"
    )
    try:
        b.page.wait_for_function(f"() => ({states})().every((s) => s === 'drawn' || s === 'empty')")
    except Exception as e:
        raise AssertionError(f"charts on {b.page.url}: {b.page.evaluate(states)}") from e


def test_every_page_loads_without_browser_errors(
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
    start_console: Any,
    browser: Browser,
) -> None:
    ns = _cluster(start_nameserver, start_broker)
    with tidemq.Admin(ns.address) as admin:
        admin.update_consumer_group("billing", max_delivery_attempts=1)
    with tidemq.Producer(ns.address) as producer:
        sent = [producer.send(TOPIC, f"order {i}".encode(), keys=[f"k{i}"]) for i in range(5)]
        delayed = producer.send(TOPIC, b"later", delay=3600)
    with tidemq.Consumer(
        ns.address, group="demo", topic=TOPIC, auto_commit=False, start_from="first"
    ) as consumer:
        got = 0
        deadline = time.monotonic() + 20
        while got < 5:
            assert time.monotonic() < deadline, f"consumed {got} of 5"
            got += len(consumer.poll(max_messages=16, timeout_s=5))
        consumer.commit()
    first = SimpleConsumerConfig(start_from="first")
    with SimpleConsumer("billing", TOPIC, nameserver=ns.address, config=first) as receiver:
        failed = receiver.receive(1, 5, timeout_s=5)
        receiver.nack(failed[0])  # one attempt allowed: straight to %DLQ%billing
    console = start_console(ns.address)
    letters: list[Any] = []
    with tidemq.Admin(ns.address) as admin:

        def dead_lettered() -> bool:
            letters[:] = admin.dead_letters("billing")
            return bool(letters)

        wait_until(dead_lettered, 20, "the dead letter")
    console.wait_sampled()
    pages = {
        "/": "ASYNC_MASTER",
        "/topics": TOPIC,
        f"/topics/{TOPIC}": "demo",
        "/groups": "billing",
        "/groups/demo": "Lag per queue",
        "/groups/billing": "Receive state",
        f"/messages?topic={TOPIC}&key=k3": sent[3].msg_id,
        f"/messages/{sent[0].msg_id}": "order 0",
        "/dlq": "billing",
        "/dlq/billing": letters[0].msg_id,
        "/pending": delayed.msg_id,
        "/sign-in": "Secret key",
    }
    for path, expected in pages.items():
        response = _open(browser, console, path)
        assert response.status == 200, f"{path}: HTTP {response.status}"
        _charts_settled(browser)
        assert expected in browser.page.content(), f"{path} does not show {expected!r}"
        assert not browser.problems.all(), f"{path}: {browser.problems.all()}"
    # The charts drew the sampled figures (uPlot ran; its data are the console's series).
    _open(browser, console, "/")
    _charts_settled(browser)
    produced = _chart_values(browser, "Produced per second, per broker group")
    assert produced and len(produced[0]) >= 2, "the produce chart has the sampled points"
    assert "Replication lag per slave: nothing to show yet" in browser.page.content()  # no slave
    assert not browser.problems.all()


def test_the_lag_chart_shows_a_group_falling_behind_and_catching_up(
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
    start_console: Any,
    browser: Browser,
) -> None:
    ns = _cluster(start_nameserver, start_broker)
    with tidemq.Admin(ns.address) as admin:
        admin.create_topic("lagging", queues=1)
    consumer = tidemq.Consumer(
        ns.address, group="trailing", topic="lagging", auto_commit=False, start_from="first"
    )
    with consumer, tidemq.Producer(ns.address) as producer:
        producer.send("lagging", b"first")
        _consume(consumer, 1)  # the group has a committed position: lag can be measured
        console = start_console(ns.address)
        _open(browser, console, "/groups/trailing")
        title = "Lag (messages) per topic"

        def lag_now() -> float | None:
            columns = _chart_values(browser, title)
            return columns[0][-1] if columns and columns[0] else None

        wait_until(lambda: lag_now() == 0, 20, "the chart showing no lag")
        futures = [producer.send_async("lagging", f"m{i}".encode()) for i in range(300)]
        assert all(f.result().ok for f in futures)
        wait_until(lambda: lag_now() == 300, 20, "the chart showing the group 300 behind")
        _consume(consumer, 300)
        wait_until(lambda: lag_now() == 0, 20, "the chart showing the group caught up")
    drawn = [v for v in _chart_values(browser, title)[0] if v is not None]
    # Behind, then caught up: the chart holds the rise and the fall, in that order.
    peak = drawn.index(300)
    assert 0 in drawn[:peak] and drawn[-1] == 0
    assert not browser.problems.all()


def _consume(consumer: tidemq.Consumer, n: int) -> None:
    got = 0
    deadline = time.monotonic() + 20
    while got < n:
        assert time.monotonic() < deadline, f"consumed {got} of {n}"
        got += len(consumer.poll(max_messages=256, timeout_s=2))
    consumer.commit()


def test_a_message_found_by_key_shows_its_delivery_history(
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
    start_console: Any,
    browser: Browser,
) -> None:
    ns = _cluster(start_nameserver, start_broker)
    with tidemq.Producer(ns.address) as producer:
        producer.send(TOPIC, b"other", keys=["order-41"])
        sent = producer.send(TOPIC, b"the one", keys=["order-42"])
    config = SimpleConsumerConfig(start_from="first", client_id="worker-7")
    with SimpleConsumer("billing", TOPIC, nameserver=ns.address, config=config) as receiver:
        first = _receive_one(receiver, sent.msg_id, invisible_s=1.0)  # left to lapse
        again = _receive_one(receiver, sent.msg_id, invisible_s=30.0)
        assert again.delivery_attempt == first.delivery_attempt + 1
        receiver.ack(again)
    console = start_console(ns.address)
    _open(browser, console, "/messages")
    form = browser.page.locator("form#search")
    form.get_by_label("Topic").fill(TOPIC)
    form.get_by_label("Key").fill("order-42")
    form.get_by_role("button", name="Find").click()
    results = browser.page.locator("table#results tbody tr")
    assert results.count() == 1  # the other key's message is not listed
    results.get_by_role("link", name=sent.msg_id).click()
    browser.page.wait_for_url(f"**/messages/{sent.msg_id}")
    assert browser.page.locator("pre#body").inner_text() == "the one"
    rows = browser.page.locator("table#history tbody tr")
    events = [[c.strip() for c in row.locator("td").all_inner_texts()] for row in rows.all()]
    lived = [(e[1], e[2], e[3], e[4]) for e in events if e[2] == "billing"]
    assert lived == [
        ("delivered", "billing", "worker-7", "1"),
        ("invisibility ended", "billing", "worker-7", "1"),
        ("redelivered", "billing", "worker-7", "2"),
        ("acked", "billing", "worker-7", "2"),
    ], events
    assert events[0][1] == "stored"
    outcome = browser.page.locator("table#groups-outcome tbody tr", has_text="billing")
    assert "acked" in outcome.inner_text()
    assert not browser.problems.all()


def _receive_one(receiver: SimpleConsumer, msg_id: str, invisible_s: float) -> Any:
    deadline = time.monotonic() + 20
    while True:
        assert time.monotonic() < deadline, f"{msg_id} was not delivered"
        for m in receiver.receive(16, invisible_s, timeout_s=1.0):
            if m.msg_id == msg_id:
                return m
            receiver.ack(m)


# ---------------------------------------------------------------------- a cluster with an ACL
def _secured(
    tmp_path: Path, start_nameserver: StartNameServer, start_broker: StartBroker
) -> NameServerProcess:
    acl = write_acl(tmp_path)
    ns = start_nameserver("--acl-file", str(acl), credentials=OPS)
    start_broker(
        "--config", str(broker_config_as_ops(tmp_path)), "--nameserver", ns.address,
        "--acl-file", str(acl), "--register-interval-ms", "500", credentials=OPS,
    )  # fmt: skip
    with tidemq.Admin(ns.address, credentials=OPS) as admin:
        wait_until(lambda: bool(admin.masters()), 20, "the broker registered")
        admin.create_topic(TOPIC, queues=2)
    return ns


# The console reads as its own account: reading every topic and group is an admin's right.
CONSOLE_ENV = {"TIDEMQ_ACCESS_KEY": OPS.access_key, "TIDEMQ_SECRET_KEY": OPS.secret_key}


def _sign_in(b: Browser, console: ConsoleProcess, access_key: str, secret_key: str) -> None:
    _open(b, console, "/sign-in")
    b.page.get_by_label("Access key").fill(access_key)
    b.page.get_by_label("Secret key").fill(secret_key)
    b.page.locator("#sign-in-form").get_by_role("button", name="Sign in").click()
    b.page.wait_for_load_state()


def test_a_dead_letter_is_resent_from_the_dlq_page(
    tmp_path: Path,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
    start_console: Any,
    browser: Browser,
) -> None:
    ns = _secured(tmp_path, start_nameserver, start_broker)
    with tidemq.Admin(ns.address, credentials=OPS) as admin:
        admin.update_consumer_group("billing", max_delivery_attempts=1)
    with tidemq.Producer(ns.address, credentials=OPS) as producer:
        sent = producer.send(TOPIC, b"failed once", keys=["order-7"])
    config = SimpleConsumerConfig(start_from="first", credentials=OPS)
    with SimpleConsumer("billing", TOPIC, nameserver=ns.address, config=config) as receiver:
        receiver.nack(_receive_one(receiver, sent.msg_id, invisible_s=30.0))
        console = start_console(ns.address, env=CONSOLE_ENV)
        console.wait_sampled()
        _sign_in(browser, console, OPS.access_key, OPS.secret_key)
        assert browser.page.locator("#sign-out").is_visible()
        _open(browser, console, "/dlq/billing")
        row = browser.page.locator("table#dead-letters tbody tr", has_text="failed once")
        row.get_by_role("button", name="Resend").click()
        # Nothing is sent before the confirmation.
        assert browser.page.locator("#confirm").is_visible()
        assert "resend dead letter" in browser.page.locator("#confirm h3").inner_text()
        browser.page.locator("#confirm-button").click()
        flash = browser.page.locator("article.flash")
        assert "resent to group billing" in flash.inner_text()
        again = _receive_one(receiver, _resent_id(flash.inner_text()), invisible_s=30.0)
        assert again.body == b"failed once"
        receiver.ack(again)
    audit = console.log()
    assert re.search(r"ops: resend dead letter .* of billing: dead letter .* resent", audit), audit
    assert not browser.problems.all()


def _resent_id(flash: str) -> str:
    m = re.search(r"resent to group \S+ as (\S+)", flash)
    assert m, flash
    return m.group(1)


def test_only_a_signed_in_admin_deletes_a_topic_and_only_after_confirming(
    tmp_path: Path,
    start_nameserver: StartNameServer,
    start_broker: StartBroker,
    start_console: Any,
    browser: Browser,
) -> None:
    ns = _secured(tmp_path, start_nameserver, start_broker)
    console = start_console(ns.address, env=CONSOLE_ENV)
    page = browser.page
    # Not signed in: no delete button, and a forged post changes nothing.
    _open(browser, console, f"/topics/{TOPIC}")
    assert page.get_by_role("button", name="Delete topic").count() == 0
    forged = page.request.post(
        console.url + f"topics/{TOPIC}/delete", form={"confirmed": "yes"}, fail_on_status_code=False
    )
    assert forged.status == 403
    # A non-admin account is refused at sign-in: the brokers' ACL says it is not an admin.
    _sign_in(browser, console, "app", "app-secret")
    assert "refused this account as an admin" in page.locator("#error").inner_text()
    # The refusal is answered 403, which Chromium reports on the console: expected here.
    assert browser.problems.console_errors == [
        "Failed to load resource: the server responded with a status of 403 (Forbidden)"
    ]
    browser.problems.console_errors.clear()
    _open(browser, console, f"/topics/{TOPIC}")
    assert page.get_by_role("button", name="Delete topic").count() == 0
    with tidemq.Admin(ns.address, credentials=OPS) as admin:
        assert TOPIC in admin.list_topics()
    # The admin deletes it, after the confirmation page.
    _sign_in(browser, console, OPS.access_key, OPS.secret_key)
    _open(browser, console, f"/topics/{TOPIC}")
    page.get_by_role("button", name="Delete topic").click()
    assert page.locator("#confirm").is_visible()
    with tidemq.Admin(ns.address, credentials=OPS) as admin:
        assert TOPIC in admin.list_topics(), "deleted before the confirmation"
        page.locator("#confirm-button").click()
        assert "deleted" in page.locator("article.flash").inner_text()
        assert TOPIC not in admin.list_topics()
    assert "ops: delete topic orders" in console.log()
    assert "app: sign-in refused" in console.log()
    assert not browser.problems.all()
