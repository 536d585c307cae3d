"""Which keys of a versioned table changed after a given data version, for incremental
registrations and config sync: bounded, so a reader too far behind gets the whole table."""

from __future__ import annotations

from collections import deque

from tidemq.services.broker.data_version import DataVersion


class ChangeLog:
    def __init__(self, floor: DataVersion, capacity: int) -> None:
        self.capacity = capacity
        # (counter, key) of each change after ``floor``, oldest first.
        self._changes: deque[tuple[int, str]] = deque()
        # counter -> timestamp of every version from the floor on: a reader's version with a
        # known counter but another timestamp is not one this table had (a slave that changed
        # its own table), and gets the whole table rather than changes that do not fit it.
        self._stamps: dict[int, int] = {}
        self.reset(floor)

    def record(self, counter: int, key: str, timestamp_ms: int) -> None:
        if len(self._changes) >= self.capacity:
            self.floor = self._changes.popleft()[0]
            while self._stamps and next(iter(self._stamps)) < self.floor:
                del self._stamps[next(iter(self._stamps))]
        self._changes.append((counter, key))
        self.stamp(counter, timestamp_ms)

    def stamp(self, counter: int, timestamp_ms: int) -> None:
        """A version this table had (its changes, if any, are recorded)."""
        self._stamps[counter] = timestamp_ms

    def reset(self, floor: DataVersion) -> None:
        """Forget everything: the table was replaced, nothing before ``floor`` is known."""
        self._changes.clear()
        self._stamps = {floor.counter: floor.timestamp_ms}
        self.floor = floor.counter

    def had(self, version: DataVersion) -> bool:
        """Whether ``version`` is one this table had, as far as the log reaches."""
        return self._stamps.get(version.counter) == version.timestamp_ms

    def since(self, version: DataVersion, current: DataVersion) -> set[str] | None:
        """The keys changed after ``version``; None when not all of them are known (another
        state version, a version ahead of ``current``, or one older than the log)."""
        if (
            version.state_version != current.state_version
            or not self.floor <= version.counter <= current.counter
        ):
            return None
        touched: set[str] = set()
        for counter, key in reversed(self._changes):
            if counter <= version.counter:
                break
            touched.add(key)
        return touched
