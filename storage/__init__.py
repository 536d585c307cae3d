"""tidemq's message store: mmap CommitLog, ConsumeQueues, IndexFile, flush, recovery, retention.

Imports nothing else of tidemq. The broker uses :class:`MessageStore`; everything else is here
for the store's own layers, tools and tests.
"""

from storage.config import FlushMode, StoreConfig
from storage.record import AppendResult, Message, StoredMessage
from storage.results import PutStatus
from storage.store import GetResult, MessageStore, PutResult, StoreStats

__all__ = [
    "AppendResult",
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
