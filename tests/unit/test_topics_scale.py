"""100,000 topics in one TopicManager, without sockets: what a change writes stays flat as the
table grows (bytes, not time), and a restart loads every topic with its version."""

from __future__ import annotations

import os
from dataclasses import replace
from pathlib import Path

import pytest

from tidemq.services.broker.topics import TopicConfig, TopicManager

N = 100_000


@pytest.fixture
def no_disk_flush(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Counts the journal's fdatasyncs instead of waiting for the disk: 100,000 real ones take
    minutes on a slow disk, and this test is about bytes (test_state_journal covers kill -9)."""
    calls: list[int] = []
    monkeypatch.setattr(os, "fdatasync", calls.append)
    return calls


def test_100k_topics_cost_flat_bytes_per_change_and_load_back(
    tmp_path: Path, no_disk_flush: list[int]
) -> None:
    topics = TopicManager(str(tmp_path))
    per_change: dict[int, float] = {}
    window = 2_000
    for start in range(0, N, window):
        before = topics.bytes_written
        for i in range(start, start + window):
            topics.upsert(TopicConfig(f"topic-{i:06d}", 8, 8))
        per_change[start + window] = (topics.bytes_written - before) / window
    assert len(no_disk_flush) >= N  # every change was flushed before upsert returned
    # A journal record is ~200 bytes; compaction adds a snapshot of n topics every n/4 changes,
    # ~4 x 150 bytes per change amortized, whatever n is. The old full rewrite wrote ~15 MB per
    # change at 100,000 topics.
    amortized_late = sum(per_change[k] for k in per_change if k > N // 2) / (len(per_change) // 2)
    amortized_early = sum(per_change[k] for k in per_change if k <= N // 2) / (len(per_change) // 2)
    assert amortized_late < 2_000
    assert amortized_late < 2 * amortized_early + 500
    # One change at 100,000 topics, outside a compaction, writes one record.
    before = topics.bytes_written
    topics.upsert(TopicConfig("one-more", 4, 4))
    assert topics.bytes_written - before < 400

    again = TopicManager(str(tmp_path))
    assert len(again.topics) == N + 1
    assert again.data_version == topics.data_version
    assert again.get("topic-054321") == TopicConfig("topic-054321", 8, 8)
    assert again.get("one-more") == TopicConfig("one-more", 4, 4)
    since = replace(again.data_version)  # the table bumps its own in place
    again.delete("topic-000000")
    changes = again.changes_since(since)
    assert changes is not None and changes.removed == ["topic-000000"]
