"""RocketMQ's put and pull outcomes as integer enums, defined once.

The members and their order are RocketMQ's (``PutMessageStatus`` and
``GetMessageStatus`` of ``org.apache.rocketmq.store``); each value is the
member's position in the Java declaration (its ``ordinal()``), so a status
crosses the compiled core, the pure-Python twin and any wire or file as a
small int. The core and the twin both take their members from here: the
core returns these very objects (no lookup by name per pull).

``rmqstore.message`` and ``rmqstore`` re-export both enums.
"""

from __future__ import annotations

import enum

__all__ = ["GetMessageStatus", "PutMessageStatus"]


class _Named(enum.IntEnum):
    """An IntEnum that prints as its member name (``FOUND``) on every
    Python: logs and messages show RocketMQ's name, comparisons and
    ``int()`` the ordinal. A numeric format (``f"{s:d}"``) formats the int."""

    def __str__(self) -> str:
        return self.name

    def __format__(self, spec: str) -> str:
        if spec and spec[-1] in "bcdoxXneEfFgG%":
            return int.__format__(self, spec)
        return format(self.name, spec)


class PutMessageStatus(_Named):
    """Outcome of a put (RocketMQ ``PutMessageStatus``), valued by its Java
    ordinal. The store answers PUT_OK, or raises: bad input raises instead
    of returning MESSAGE_ILLEGAL / PROPERTIES_SIZE_EXCEEDED, and a full disk
    or a failed new file raises an error whose ``status`` is
    SERVICE_NOT_AVAILABLE or CREATE_MAPPED_FILE_FAILED. The other members
    (replication, timer wheel, light message queues) are RocketMQ's and are
    never given by this store."""

    PUT_OK = 0
    FLUSH_DISK_TIMEOUT = 1
    FLUSH_SLAVE_TIMEOUT = 2
    SLAVE_NOT_AVAILABLE = 3
    SERVICE_NOT_AVAILABLE = 4
    CREATE_MAPPED_FILE_FAILED = 5
    MESSAGE_ILLEGAL = 6
    PROPERTIES_SIZE_EXCEEDED = 7
    OS_PAGE_CACHE_BUSY = 8
    UNKNOWN_ERROR = 9
    IN_SYNC_REPLICAS_NOT_ENOUGH = 10
    PUT_TO_REMOTE_BROKER_FAIL = 11
    LMQ_CONSUME_QUEUE_NUM_EXCEEDED = 12
    WHEEL_TIMER_FLOW_CONTROL = 13
    WHEEL_TIMER_MSG_ILLEGAL = 14
    WHEEL_TIMER_NOT_ENABLE = 15


class GetMessageStatus(_Named):
    """Outcome of a pull (RocketMQ ``GetMessageStatus``), valued by its Java
    ordinal, with the ``next_begin_offset`` each comes with (RocketMQ
    ``DefaultMessageStore.getMessage`` on a master):

    - NO_MATCHED_LOGIC_QUEUE: no such queue; next 0 (min and max 0).
    - NO_MESSAGE_IN_QUEUE: the queue's max offset is 0; next 0.
    - OFFSET_TOO_SMALL: offset below the queue's min offset; next the min.
    - OFFSET_OVERFLOW_ONE: offset equals the max offset (nothing new yet);
      next the offset itself.
    - OFFSET_OVERFLOW_BADLY: offset past the max offset; next the max.
    - FOUND: messages came back; next the unit after the last one read.
    - MESSAGE_WAS_REMOVING: nothing came back, units whose records clean-up
      deleted were skipped; next past them.
    - NO_MATCHED_MESSAGE: nothing came back (a tag filter matched nothing,
      or units were skipped); next past the units read.

    OFFSET_FOUND_NULL and OFFSET_RESET are RocketMQ's; this store never
    gives them."""

    FOUND = 0
    NO_MATCHED_MESSAGE = 1
    MESSAGE_WAS_REMOVING = 2
    OFFSET_FOUND_NULL = 3
    OFFSET_OVERFLOW_BADLY = 4
    OFFSET_OVERFLOW_ONE = 5
    OFFSET_TOO_SMALL = 6
    NO_MATCHED_LOGIC_QUEUE = 7
    NO_MESSAGE_IN_QUEUE = 8
    OFFSET_RESET = 9
