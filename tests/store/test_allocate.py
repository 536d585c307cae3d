"""Every fixed-size file the store makes is created by ``storage.allocate``: a full disk is
DiskFullError wherever it happens, any other failure StoreNotWritableError, no file is left."""

import errno
import os
from collections.abc import Callable
from pathlib import Path

import pytest

from tidemq.storage.checkpoint import Checkpoint, write_checkpoint
from tidemq.storage.errors import DiskFullError, StoreNotWritableError
from tidemq.storage.index_file import IndexFile
from tidemq.storage.mapped_file import MappedFile

pytestmark = pytest.mark.store


def _creators(d: Path) -> list[Callable[[], object]]:
    return [
        lambda: MappedFile.create(str(d / f"{0:020d}"), 4096, 0),
        lambda: IndexFile.create(str(d / "20240101000000000"), 4, 4, 0, 0),
        lambda: write_checkpoint(str(d), Checkpoint()),
    ]


@pytest.mark.parametrize(
    ("code", "error"), [(errno.ENOSPC, DiskFullError), (errno.EIO, StoreNotWritableError)]
)
def test_a_failed_reservation_is_a_typed_error_and_leaves_no_file(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, code: int, error: type[Exception]
) -> None:
    def refuse(_fd: int, _offset: int, _length: int) -> None:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "posix_fallocate", refuse)
    for create in _creators(tmp_path):
        with pytest.raises(error) as e:
            create()
        assert type(e.value) is error  # DiskFullError is a StoreNotWritableError too
    assert os.listdir(tmp_path) == []


def test_files_are_created_at_their_full_size(tmp_path: Path) -> None:
    f = MappedFile.create(str(tmp_path / f"{0:020d}"), 4096, 0)
    f.close()
    write_checkpoint(str(tmp_path), Checkpoint(recovery_offset=7))
    assert os.path.getsize(tmp_path / f"{0:020d}") == 4096
    assert os.path.getsize(tmp_path / "checkpoint") == 4096
