"""rmqstore: Apache RocketMQ's message store as an embedded Python library.

CommitLog, ConsumeQueue, IndexFile, checkpoint and recovery, byte-compatible
with the files a RocketMQ broker writes; hot paths in a Cython core with a
pure-Python twin (``rmqstore.IMPLEMENTATION`` says which one is live).
"""

from ._kernels import IMPLEMENTATION
from .config import ASYNC_FLUSH, NO_FLUSH, SYNC_FLUSH, StoreConfig
from .exceptions import (
    ArgumentError,
    ConfigError,
    CorruptedFileError,
    DiskFullError,
    FlushError,
    IllegalMessageError,
    MessageTooLargeError,
    MessageTypeError,
    PropertiesSizeExceededError,
    RmqStoreError,
    StoreClosedError,
    StoreLockedError,
    StoreReadOnlyError,
)
from .message import (
    GetColumnsResult,
    GetMessageResult,
    GetMessageStatus,
    GetViewsResult,
    Message,
    MessageExt,
    PutColumnsResult,
    PutMessageResult,
    PutMessageStatus,
    new_unique_key,
)
from .service.consumer import Consumer
from .service.offsets import ConsumerOffsetStore
from .store import MessageStore

__version__ = "0.1.0"

__all__ = [
    "IMPLEMENTATION",
    "MessageStore",
    "Consumer",
    "ConsumerOffsetStore",
    "StoreConfig",
    "ASYNC_FLUSH",
    "NO_FLUSH",
    "SYNC_FLUSH",
    "Message",
    "MessageExt",
    "PutMessageStatus",
    "GetMessageStatus",
    "PutMessageResult",
    "GetMessageResult",
    "GetColumnsResult",
    "GetViewsResult",
    "PutColumnsResult",
    "new_unique_key",
    "RmqStoreError",
    "ConfigError",
    "CorruptedFileError",
    "IllegalMessageError",
    "MessageTooLargeError",
    "PropertiesSizeExceededError",
    "MessageTypeError",
    "ArgumentError",
    "StoreClosedError",
    "StoreReadOnlyError",
    "StoreLockedError",
    "FlushError",
    "DiskFullError",
]
