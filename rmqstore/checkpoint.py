"""The ``checkpoint`` file: five big-endian i64 fields in 4096 bytes (SPEC §8.1)."""

from __future__ import annotations

import logging
import os
import struct

from ._layout import CHECKPOINT_FILE_SIZE
from .mapped_file import _NOFOLLOW, open_no_follow

__all__ = ["StoreCheckpoint"]

log = logging.getLogger("rmqstore.checkpoint")

_FIELDS = struct.Struct(">qqqqq")
_NAMES = (
    "physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp", "master_flushed_offset",
    "confirm_phy_offset",
)


class StoreCheckpoint:
    """RocketMQ ``StoreCheckpoint``.

    Attributes (ms since epoch, or a physical offset):
        physic_msg_timestamp, logics_msg_timestamp, index_msg_timestamp,
        master_flushed_offset, confirm_phy_offset.
    """

    __slots__ = (
        "path", "physic_msg_timestamp", "logics_msg_timestamp", "index_msg_timestamp",
        "master_flushed_offset", "confirm_phy_offset", "_written",
    )

    def __init__(self, path):
        self.path = str(path)
        self._written = b""  # what the last flush put on disk
        self.physic_msg_timestamp = 0
        self.logics_msg_timestamp = 0
        self.index_msg_timestamp = 0
        self.master_flushed_offset = 0
        self.confirm_phy_offset = 0

    def load(self) -> bool:
        """Read the file if it exists; returns whether it held the five fields.
        A missing, empty or short file (a crash during its first write) leaves
        every field 0: recovery then starts from the first CommitLog segment,
        which is always safe. The checkpoint only advises where to start."""
        try:
            with open(self.path, "rb") as fh:
                data = fh.read(_FIELDS.size)
        except FileNotFoundError:
            return False
        if len(data) < _FIELDS.size:
            log.warning("checkpoint %s holds %d bytes; ignoring it (full recovery scan)", self.path, len(data))
            return False
        (
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
            self.master_flushed_offset, self.confirm_phy_offset,
        ) = _FIELDS.unpack(data)
        return True

    @property
    def min_timestamp(self) -> int:
        """``max(0, min(physic, logics) - 3000)``: where abnormal recovery may start."""
        return max(0, min(self.physic_msg_timestamp, self.logics_msg_timestamp) - 3000)

    @property
    def min_timestamp_index(self) -> int:
        return min(self.min_timestamp, self.index_msg_timestamp)

    def to_bytes(self) -> bytes:
        return _FIELDS.pack(
            self.physic_msg_timestamp, self.logics_msg_timestamp, self.index_msg_timestamp,
            self.master_flushed_offset, self.confirm_phy_offset,
        ) + bytes(CHECKPOINT_FILE_SIZE - _FIELDS.size)

    def flush(self) -> None:
        """Write all 4096 bytes in place and fsync (the file keeps its inode, as
        RocketMQ's mapped checkpoint does); nothing to do when the values are
        the ones this object last wrote (the store flushes it every second)."""
        data = self.to_bytes()
        if data == self._written:
            return
        flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
        fd = open_no_follow(self.path, flags, 0o644)  # never written through a symbolic link
        try:
            os.pwrite(fd, data, 0)
            os.fsync(fd)
        finally:
            os.close(fd)
        self._written = data

    def to_dict(self) -> dict:
        return {name: getattr(self, name) for name in _NAMES}
