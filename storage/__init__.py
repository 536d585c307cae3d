"""tidemq's message store: mmap CommitLog, ConsumeQueues, IndexFile, flush, recovery, retention.

Imports nothing else of tidemq. The broker uses :class:`MessageStore`; everything else is here
for the store's own layers, tools and tests.
"""

from tidemq.storage.config import FlushMode, StoreConfig
from tidemq.storage.log_reader import CommitLogReader
from tidemq.storage.reads import GetResult
from tidemq.storage.record import AppendResult, Message, StoredMessage
from tidemq.storage.results import PutStatus
from tidemq.storage.store import MessageStore, PutResult, StoreStats

__all__ = [
    "AppendResult",
    "CommitLogReader",
    "FlushMode",
    "GetResult",
    "Message",
    "MessageStore",
    "PutResult",
    "PutStatus",
    "StoreConfig",
    "StoreStats",
    "StoredMessage",
]
