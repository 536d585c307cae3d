from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from tidemq.storage import MessageStore, StoreConfig

StoreFactory = Callable[..., MessageStore]


def tiny_config(root: Path, **overrides: Any) -> StoreConfig:
    """Files small enough that rolls, blank markers and new queue files happen constantly."""
    kwargs: dict[str, Any] = {
        "commitlog_file_size_bytes": 4096,
        "consume_queue_entries_per_file": 16,
        "index_slot_num": 8,
        "index_max_num": 32,
    }
    kwargs.update(overrides)
    return StoreConfig(str(root), **kwargs)


@pytest.fixture
def open_store(tmp_path: Path) -> Iterator[StoreFactory]:
    """Open stores under tmp_path with tiny files; every store still open is closed at the end."""
    opened: list[MessageStore] = []

    def factory(name: str = "store", **overrides: Any) -> MessageStore:
        s = MessageStore(tiny_config(tmp_path / name, **overrides)).open()
        opened.append(s)
        return s

    yield factory
    for s in opened:
        s.close()


CRASH_SUMMARY = pytest.StashKey[list[str]]()


@pytest.fixture
def report_summary(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """Print a line now (seen with ``-s``) and again in pytest's closing summary, so a run
    says how many kills it drove and how many ran clean without ``-s`` too."""
    lines = request.config.stash.setdefault(CRASH_SUMMARY, [])

    def report(line: str) -> None:
        print(line)
        lines.append(line)

    return report


def pytest_terminal_summary(terminalreporter: Any, config: pytest.Config) -> None:
    lines = config.stash.get(CRASH_SUMMARY, [])
    if lines:
        terminalreporter.section("store crash tests")
        for line in lines:
            terminalreporter.write_line(line)
