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
