"""Epoch lists and where two logs part (RocketMQ's EpochFileCacheTest cases), and the epoch
file's bytes, backup and refusal of torn content."""

from __future__ import annotations

from pathlib import Path

import pytest

from tidemq.replication.epochs import (
    EpochEntry,
    EpochFile,
    EpochFileError,
    EpochLog,
    consistent_point,
    decode,
    encode,
)


def entries(*pairs: tuple[int, int]) -> list[EpochEntry]:
    return [EpochEntry(e, s) for e, s in pairs]


def test_the_point_is_the_lower_end_of_the_newest_epoch_both_started_alike() -> None:
    local = entries((1, 100), (2, 300), (3, 500))
    # The master's epoch 3 started elsewhere: epoch 2 is the newest shared one, and it ended
    # at 450 on the master, 500 here.
    assert consistent_point(local, 700, entries((1, 100), (2, 300), (3, 450)), 600) == 450
    # Same epochs: the shorter of the two logs.
    assert consistent_point(local, 700, entries((1, 100), (2, 300), (3, 500)), 600) == 600
    # One side went on to an epoch the other never saw: the other's end of epoch 3.
    four = entries((1, 100), (2, 300), (3, 500), (4, 800))
    assert consistent_point(four, 900, entries((1, 100), (2, 300), (3, 500)), 700) == 700
    assert consistent_point(entries((1, 100), (2, 300), (3, 500)), 700, four, 900) == 700


def test_logs_without_a_shared_epoch_have_no_consistent_point() -> None:
    assert consistent_point(entries((1, 0), (2, 300)), 400, entries((1, 10), (3, 300)), 500) is None
    assert consistent_point([], 0, entries((1, 0)), 100) is None


def test_an_epoch_that_wrote_nothing_is_replaced_and_order_is_enforced() -> None:
    log = EpochLog(entries((1, 0), (2, 100)))
    log.append(3, 100)  # epoch 2 wrote nothing before epoch 3 began
    assert log.entries == entries((1, 0), (3, 100))
    with pytest.raises(ValueError, match="not after"):
        log.append(3, 200)  # not a newer epoch
    with pytest.raises(ValueError, match="before epoch"):
        log.append(4, 50)  # starts before the last one
    assert log.epoch_at(99) == EpochEntry(1, 0)
    assert log.epoch_at(100) == EpochEntry(3, 100)
    assert log.next_start_after(1) == 100 and log.next_start_after(3) is None


def test_cuts_at_either_end_keep_the_epochs_that_still_cover_bytes() -> None:
    log = EpochLog(entries((1, 0), (2, 100), (3, 200)))
    log.truncate_from(200)
    assert log.entries == entries((1, 0), (2, 100))
    log.truncate_before(150)  # epoch 1's bytes are all gone; epoch 2 still covers 150
    assert log.entries == entries((2, 100))


def test_epoch_file_bytes_are_pinned() -> None:
    data = encode(entries((1, 0), (4, 1048576)))
    assert data == b"2\n2545294616\n1-0\n4-1048576\n"
    assert decode(data) == entries((1, 0), (4, 1048576))
    assert encode([]) == b"0\n0\n"


@pytest.mark.parametrize(
    "torn",
    [b"2\n2545294616\n1-0\n4-10485", b"2\n2545294617\n1-0\n4-1048576\n", b"", b"\xff"],
)
def test_torn_or_corrupt_epoch_files_are_refused(torn: bytes) -> None:
    with pytest.raises(EpochFileError):
        decode(torn)


def test_the_epoch_file_survives_reopening_and_falls_back_to_its_backup(tmp_path: Path) -> None:
    f = EpochFile(tmp_path)
    assert f.entries == [] and f.last_epoch == 0
    f.append(1, 0)
    f.append(2, 4096)
    assert EpochFile(tmp_path).entries == entries((1, 0), (2, 4096))
    # A torn write of the main file: the previous list (from the backup) is what loads.
    (tmp_path / "epochs").write_bytes(b"3\n123\n1-0\n")
    assert EpochFile(tmp_path).entries == entries((1, 0))
    (tmp_path / "epochs.bak").write_bytes(b"garbage")
    with pytest.raises(EpochFileError):
        EpochFile(tmp_path)
