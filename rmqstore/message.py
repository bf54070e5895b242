"""Messages, put/get results and identifiers (docs/format.md#commitlog-record, docs/format.md#message-ids).

``Message`` is what a producer hands to :meth:`MessageStore.put_message`;
``MessageExt`` is a stored record as read back (RocketMQ's ``MessageExt``).
Both are the live implementation's classes: the Cython core's
(``rmqstore/_core.pyx``) or, with ``RMQSTORE_PURE_PYTHON=1`` or no built
core, their pure-Python twins (``rmqstore/_pure/message.py``), with the same
fields, methods and errors.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, NamedTuple

from ._kernels import k
from ._pure import message as _pure_message
from ._pure.message import _INT64 as _INT64
from ._pure.message import _check_int as _check_int
from ._status import GetMessageStatus, PutMessageStatus  # (defined once, for the core and the twin)
from .format.ids import _split_offset_msg_id as _split_offset_msg_id
from .format.ids import decode_host, decode_offset_msg_id, encode_host, new_unique_key, offset_msg_id

__all__ = [
    "Message",
    "MessageExt",
    "PutMessageStatus",
    "GetMessageStatus",
    "PutMessageResult",
    "GetMessageResult",
    "GetColumnsResult",
    "PutColumnsResult",
    "encode_host",
    "decode_host",
    "offset_msg_id",
    "decode_offset_msg_id",
    "new_unique_key",
]

if TYPE_CHECKING:  # (both implementations have the same shape)
    from ._pure.message import Message, MessageExt
else:
    Message = k.Message
    MessageExt = k.MessageExt
# what a store takes for a message: either implementation's Message (the
# other one's goes the step-by-step way)
MESSAGE_TYPES = (k.Message, _pure_message.Message)


class PutMessageResult(NamedTuple):
    """Result of one put. ``wrote_offset`` is the record's physical offset,
    ``wrote_bytes`` its size, ``store_timestamp`` ms since epoch, ``msg_id`` the
    offset message id (docs/format.md#offset-msgid)."""

    status: PutMessageStatus
    msg_id: str
    wrote_offset: int
    wrote_bytes: int
    queue_offset: int
    store_timestamp: int


class GetMessageResult(NamedTuple):
    """Result of a pull: the messages found and the queue offsets to go on from."""

    status: GetMessageStatus
    messages: list
    next_begin_offset: int
    min_offset: int
    max_offset: int


class PutColumnsResult(NamedTuple):
    """Result of a columnar put (:meth:`MessageStore.put_message_columns`):
    one row per message, in the order given. ``physical_offsets``,
    ``sizes`` (record bytes) and ``queue_offsets`` are numpy int64 arrays;
    ``store_timestamp`` (ms since epoch) is the batch's one store time. A
    message's offset msgId is ``offset_msg_id(store_host_raw,
    physical_offset)``."""

    status: PutMessageStatus
    physical_offsets: object
    sizes: object
    queue_offsets: object
    store_timestamp: int


class GetColumnsResult(NamedTuple):
    """Result of a columnar pull (:meth:`MessageStore.get_message_columns`):
    ``columns`` is ``decode_columns``' dict of numpy arrays, one row per
    message found (see :mod:`rmqstore._pure`), and the queue offsets as for
    :class:`GetMessageResult`."""

    status: GetMessageStatus
    columns: dict
    next_begin_offset: int
    min_offset: int
    max_offset: int


class GetViewsResult(NamedTuple):
    """Result of a zero-copy pull (:meth:`MessageStore.get_message_views`).

    ``buffer`` is a read-only memoryview of the one CommitLog segment that
    holds the messages (None when there are none); ``units`` a numpy
    structured array, one row per message, with int64 fields
    ``queue_offset``, ``physical_offset``, ``store_timestamp`` (ms),
    ``tags_code``, ``body_offset`` (bytes into ``buffer``) and int32
    ``body_length``, ``store_size``. Message *i*'s body is
    ``buffer[body_offset : body_offset + body_length]``. The buffer pins the
    mapping: it stays readable after clean-up deletes the file or the store
    closes, until the last view of it is released. Status and offsets are
    those of :class:`GetMessageResult`."""

    status: GetMessageStatus
    buffer: Any
    units: Any
    next_begin_offset: int
    min_offset: int
    max_offset: int

    def bodies(self) -> list:
        """The bodies as memoryviews of ``buffer`` (one object each: the
        columns are the fast way)."""
        buf = self.buffer
        if buf is None:
            return []
        return [buf[o : o + n] for o, n in zip(self.units["body_offset"].tolist(), self.units["body_length"].tolist())]
