"""The load threads of the replication, failover and container tests (``tests.workers``): a
worker that dies of an unexpected exception fails the test that waits on it or joins it, with
that exception as the cause; it never just stops sending."""

from __future__ import annotations

import threading

import pytest

from tests.waiting import wait_until
from tests.workers import Worker, WorkerFailed, finish_all

pytestmark = pytest.mark.unit


def test_an_exception_in_a_worker_fails_the_wait_and_the_join_with_its_cause() -> None:
    sent: list[int] = []

    def load() -> None:
        sent.append(1)
        raise ConnectionResetError("the broker hung up")

    w = Worker(load, name="load")
    w.start()
    with pytest.raises(WorkerFailed, match="load worker load failed") as waited:
        wait_until(lambda: w.check() and len(sent) > 100, 30, "100 sends")
    assert isinstance(waited.value.__cause__, ConnectionResetError)
    with pytest.raises(WorkerFailed) as joined:
        w.finish(10)
    assert isinstance(joined.value.__cause__, ConnectionResetError)


def test_a_worker_that_ends_normally_joins_quietly() -> None:
    stop = threading.Event()
    workers = [Worker(lambda: stop.wait(30), name=f"w{i}") for i in range(3)]
    for w in workers:
        w.start()
    assert all(w.check() for w in workers)
    stop.set()
    finish_all(workers, 10)


def test_a_worker_still_running_at_the_join_fails_it() -> None:
    release = threading.Event()
    w = Worker(lambda: release.wait(30), name="stuck")
    w.start()
    try:
        with pytest.raises(WorkerFailed, match="still running"):
            w.finish(0.05)
    finally:
        release.set()
        w.finish(10)


def test_a_failure_in_any_worker_fails_finish_all_after_joining_every_one() -> None:
    def boom() -> None:
        raise KeyError("unexpected")

    ok = Worker(lambda: None, name="ok")
    bad = Worker(boom, name="bad")
    for w in (ok, bad):
        w.start()
    with pytest.raises(WorkerFailed, match="bad"):
        finish_all([ok, bad], 10)
    assert not ok.is_alive() and not bad.is_alive()
