"""tidemq's message store: mmap CommitLog, ConsumeQueues, IndexFile, flush, recovery, retention.

Imports nothing else of tidemq. The broker uses :class:`MessageStore`; everything else is here
for the store's own layers, tools and tests.
"""

from tidemq.storage.answers import BlockPutResult
from tidemq.storage.config import FlushMode, StoreConfig
from tidemq.storage.log_reader import CommitLogReader
from tidemq.storage.reads import GetResult, RecordsResult
from tidemq.storage.record import AppendResult, BlockPlacement, Message, SentBlock, StoredMessage
from tidemq.storage.record.block import CorruptBlockError
from tidemq.storage.results import PutStatus
from tidemq.storage.store import MessageStore, PutResult, StoreStats

__all__ = [
    "AppendResult",
    "BlockPlacement",
    "BlockPutResult",
    "CommitLogReader",
    "CorruptBlockError",
    "FlushMode",
    "GetResult",
    "Message",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "RecordsResult",
    "SentBlock",
    "StoreConfig",
    "StoreStats",
    "StoredMessage",
]
