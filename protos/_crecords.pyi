"""Typed stubs of the compiled twin of ``tidemq.protos.record_blocks`` (``_crecords.c``); the
functions there document the arguments, results and errors, which are the same."""

from collections.abc import Callable, Mapping, Sequence
from typing import Any, Self, TypeVar

_T = TypeVar("_T")
_TupleT = TypeVar("_TupleT", bound=tuple[Any, ...])
_RefT = TypeVar("_RefT", bound="RecordRef")

def configure(error_class: type[ValueError], ipv6_text: Callable[[bytes], str], /) -> None: ...
def encode_block(
    topic: str,
    queue_id: int,
    messages: Sequence[tuple[bytes, str | None, Sequence[str], Mapping[str, str] | None, int]],
) -> bytes: ...
def check_message(
    tag: str | None, keys: Sequence[str], properties: Mapping[str, str] | None
) -> None: ...
def block_results(
    cls: type[_TupleT],
    template: _TupleT,
    at: tuple[int, int, int],
    records: bytes,
    first_queue_offset: int,
    first_commitlog_offset: int,
    added_bytes: int,
    head_added_bytes: int,
    file_start_indexes: Sequence[int],
    file_start_offsets: Sequence[int],
    store_host: bytes,
    store_port: int,
) -> list[_TupleT]: ...
def decode_records(cls: type[_T], common: dict[str, Any], records: bytes) -> list[_T]: ...
def make_msg_id(store_address: bytes, store_port: int, commitlog_offset: int) -> str: ...

class BlockBuilder:
    def __new__(cls, topic: str, max_records: int, max_bytes: int) -> Self: ...
    def append(
        self,
        body: bytes,
        tag: str | None,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
        born_ms: int | None = None,
    ) -> int: ...
    def add(
        self,
        ref_class: type[_RefT],
        owner: Any,
        body: bytes,
        tag: str | None,
        keys: Sequence[str],
        properties: Mapping[str, str] | None,
        /,
    ) -> _RefT | None: ...
    def seal(self) -> bool: ...
    def records(self, queue_id: int, /) -> bytes: ...
    def results(
        self,
        cls: type[_TupleT],
        template: _TupleT,
        at: tuple[int, int, int],
        first_queue_offset: int,
        first_commitlog_offset: int,
        added_bytes: int,
        head_added_bytes: int,
        file_start_indexes: Sequence[int],
        file_start_offsets: Sequence[int],
        store_host: bytes,
        store_port: int,
    ) -> list[_TupleT]: ...
    def release(self) -> None: ...
    @property
    def count(self) -> int: ...
    @property
    def size(self) -> int: ...
    @property
    def full(self) -> bool: ...
    @property
    def sealed(self) -> bool: ...

class RecordRef:
    """No garbage-collector support: see record_blocks' docstring."""

    def __new__(cls, owner: Any, index: int) -> Self: ...
    @property
    def owner(self) -> Any: ...
    @property
    def index(self) -> int: ...
