"""One exception hierarchy for rmqstore.

Every class derives from :class:`RmqStoreError` and also from the builtin it
resembles, so ``except ValueError`` keeps working for callers that do not know
rmqstore. Expected outcomes (end of data, message not found) are statuses or
``None``, never exceptions.
"""

from __future__ import annotations

__all__ = [
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
    "OutputNotVisibleError",
]


class RmqStoreError(Exception):
    """Base class of every error rmqstore raises on purpose."""


class ConfigError(RmqStoreError, ValueError):
    """A configuration value or name is invalid, or disagrees with the files on disk."""


class CorruptedFileError(RmqStoreError, ValueError):
    """A store file does not hold what its format allows.

    Attributes:
        path: the file (str) or None when not tied to one file.
        offset: byte position in that file (or physical offset) where the
            problem was found, or None.
    """

    def __init__(self, message: str, path=None, offset=None):
        self.path = None if path is None else str(path)
        self.offset = offset
        where = []
        if self.path is not None:
            where.append(self.path)
        if offset is not None:
            where.append(f"offset {offset}")
        super().__init__(f"{message} ({', '.join(where)})" if where else message)


class IllegalMessageError(RmqStoreError, ValueError):
    """A message cannot be stored as given (RocketMQ's MESSAGE_ILLEGAL): bad
    topic, bad property name or value, transaction flags out of range."""


class MessageTooLargeError(IllegalMessageError):
    """The body exceeds ``max_message_size`` or the record cannot fit in one
    CommitLog file (RocketMQ's MESSAGE_ILLEGAL for size)."""


class PropertiesSizeExceededError(IllegalMessageError):
    """The encoded properties exceed 32767 bytes (RocketMQ's PROPERTIES_SIZE_EXCEEDED)."""


class MessageTypeError(RmqStoreError, TypeError):
    """A message field, or an argument of a store method, has the wrong
    Python type (a bool or a float where an int is expected included)."""


class ArgumentError(RmqStoreError, ValueError):
    """An argument of a store method is outside its allowed range (a count
    below 1, an offset or a time outside a 64-bit long, a queue id outside
    a 32-bit int, a wait that is negative, NaN or infinite, ...). The
    message names the argument and the range."""


class StoreClosedError(RmqStoreError, ValueError):
    """The store (or a file of it) was used after ``close()``."""


class StoreReadOnlyError(RmqStoreError, PermissionError):
    """A write was attempted on a store opened with ``read_only=True``."""


class StoreLockedError(RmqStoreError, BlockingIOError):
    """Another writer holds the store's ``lock`` file."""


class FlushError(RmqStoreError, OSError):
    """Forcing data to disk failed; the store refuses further writes."""


class DiskFullError(RmqStoreError, OSError):
    """A put was refused for lack of disk space; nothing of it was written.

    Raised in two cases:

    * disk use of the CommitLog's partition is above
      ``disk_space_warning_level_ratio`` (RocketMQ sets its DISK_FULL running
      flag and answers SERVICE_NOT_AVAILABLE): ``status`` is
      ``PutMessageStatus.SERVICE_NOT_AVAILABLE``. Puts resume by themselves
      once use falls back below the level (re-checked at most every
      ``disk_check_interval`` ms).
    * the file system had no room for a new store file (ENOSPC/EDQUOT while
      reserving it): ``status`` is ``PutMessageStatus.CREATE_MAPPED_FILE_FAILED``.

    Attributes:
        status (PutMessageStatus): the RocketMQ put status this stands for.
        ratio (float | None): the disk use ratio (0..1) that caused it, if known.
        stored (bool): always False: a put makes every file it needs before
            it writes, and undoes what it wrote when it fails after that, so
            nothing of a refused put is stored and it may be retried.
            (Kept for callers written against earlier versions.)
        results (list | None): always None, for the same reason.
    """

    def __init__(self, *args, status=None, ratio=None, stored: bool = False, results=None):
        super().__init__(*args)
        if status is None:
            from .message import PutMessageStatus

            status = PutMessageStatus.CREATE_MAPPED_FILE_FAILED
        self.status = status
        self.ratio = ratio
        self.stored = stored
        self.results = results


class OutputNotVisibleError(RmqStoreError, FileNotFoundError):
    """A Spark job's tasks wrote output the driver cannot see (their files
    are missing or of another size where the driver looks): the executors
    do not share the driver's disk. The job fails before it changes the
    target; a store on such a cluster belongs on storage every host shares
    (a shared mount, or a URI such as ``s3://`` or ``hdfs://``)."""
