"""The transient store pool's commit service (``storage.flush.CommitService``) stepped by hand,
without its thread, files or a real clock: which futures a commit answers, when a commit may
skip a few pages, and what a failed commit does."""

from __future__ import annotations

from concurrent.futures import Future

import pytest

from tidemq.storage.errors import DiskFailedError
from tidemq.storage.flush import CommitService
from tidemq.storage.results import PutStatus

pytestmark = pytest.mark.unit


class FakeLog:
    """A log whose appends and commits the test moves by hand."""

    def __init__(self) -> None:
        self.end = 0  # appended
        self.committed = 0
        self.asked: list[int] = []  # least_pages of every commit
        self.fail: BaseException | None = None

    def commit(self, least_pages: int) -> int:
        self.asked.append(least_pages)
        if self.fail is not None:
            raise self.fail
        if least_pages == 0 or self.end - self.committed >= least_pages * 4096:
            self.committed = self.end
        return self.committed


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def _service(log: FakeLog, clock: Clock, heard: list[int] | None = None) -> CommitService:
    return CommitService(
        log.commit,
        lambda: log.end,
        interval_ms=200,
        least_pages=4,
        on_committed=(heard if heard is not None else []).append,
        on_error=lambda e: None,
        clock=clock,
    )


def test_a_put_is_answered_once_a_commit_covers_its_end() -> None:
    log, clock = FakeLog(), Clock()
    heard: list[int] = []
    svc = _service(log, clock, heard)
    log.end = 1000
    first = svc.submit(1000)
    log.end = 3000
    second = svc.submit(3000)
    assert not first.done() and not second.done()
    log.end = 5000  # appended after the futures: the commit takes it too
    assert svc.step() == 5000
    assert first.result(0) is second.result(0) is PutStatus.PUT_OK
    assert heard == [5000]


def test_a_put_after_a_truncation_waits_for_its_own_commit() -> None:
    log, clock = FakeLog(), Clock()
    svc = _service(log, clock)
    log.end = 5000
    svc.submit(5000)
    svc.step()
    log.committed = log.end = 2000  # cut back
    log.end = 3000  # a new put's bytes, in a buffer
    fut = svc.submit(3000)
    assert not fut.done()  # not answered from the 5000 committed before the cut
    svc.step()
    assert fut.result(0) is PutStatus.PUT_OK


def test_a_waiting_put_makes_the_commit_take_every_page() -> None:
    log, clock = FakeLog(), Clock()
    svc = _service(log, clock)
    svc.step(0)  # a full commit just now
    log.end = 100
    assert svc.step() == 0  # nobody waits, within the interval: fewer than 4 pages wait
    assert log.asked[-1] == 4
    fut = svc.submit(100)
    assert svc.step() == 100
    assert log.asked[-1] == 0
    assert fut.done()


def test_the_interval_passing_commits_whatever_is_there() -> None:
    log, clock = FakeLog(), Clock()
    svc = _service(log, clock)
    svc.step(0)
    log.end = 100
    clock.now += 0.2
    assert svc.step() == 100
    assert log.asked[-1] == 0


def test_puts_cut_by_a_truncation_are_answered_once_nothing_is_left_uncommitted() -> None:
    log, clock = FakeLog(), Clock()
    svc = _service(log, clock)
    log.end = 5000
    cut = svc.submit(5000)
    # A truncation commits everything, then cuts the log back to 2000.
    log.committed = log.end = 2000
    assert svc.step() == 2000
    assert cut.result(0) is PutStatus.PUT_OK


def test_a_put_submitted_during_a_commit_is_not_answered_by_it() -> None:
    log, clock = FakeLog(), Clock()
    svc = _service(log, clock)
    log.end = 1000
    late: list[Future[PutStatus]] = []

    def commit_while_a_put_arrives(least_pages: int) -> int:
        committed = log.commit(least_pages)
        # A put appends past what the commit copied and waits; then a truncation cuts the log
        # back to the commit's end. Nothing is uncommitted now, but the put is not one the
        # commit covered, so it is not answered by it.
        log.end = 1500
        late.append(svc.submit(1500))
        log.end = committed
        return committed

    svc._commit = commit_while_a_put_arrives
    svc.step()
    assert not late[0].done()


def test_a_failed_commit_fails_every_waiting_and_later_put() -> None:
    log, clock = FakeLog(), Clock()
    errors: list[BaseException] = []
    svc = CommitService(
        log.commit,
        lambda: log.end,
        interval_ms=200,
        least_pages=4,
        on_committed=lambda _: None,
        on_error=errors.append,
        clock=clock,
    )
    log.end = 100
    waiting = svc.submit(100)
    log.fail = DiskFailedError("pwrite: EIO")
    svc.start()  # the thread steps, meets the failure, reports it and stops
    with pytest.raises(DiskFailedError):
        waiting.result(10)
    assert errors == [log.fail]
    with pytest.raises(DiskFailedError):
        svc.submit(100).result(0)
    svc.stop()
