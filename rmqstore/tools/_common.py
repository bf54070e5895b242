"""Helpers the damaged-store tools share: scanning for zero bytes, the most
common file size, store-relative paths and the ConsumeQueue directories of a
store. Nothing here opens a file writable."""

from __future__ import annotations

import os
import struct

from ..storage.consumequeue import queue_dirs

_I32 = struct.Struct(">i")
_I64 = struct.Struct(">q")
_INDEX_HEADER = struct.Struct(">qqqqii")

_ZCHUNK = 1 << 20
_ZEROS = bytes(_ZCHUNK)


def _first_nonzero(buf, start: int, end: int) -> int:
    """Position of the first non-zero byte in ``buf[start:end]``, or -1."""
    p = start
    while p < end:
        q = min(end, p + _ZCHUNK)
        chunk = buf[p:q]
        if chunk != _ZEROS[: q - p]:
            return p + len(chunk) - len(chunk.lstrip(b"\0"))
        p = q
    return -1


def _nonzero_end(buf, start: int, end: int) -> int:
    """Position just past the last non-zero byte of ``buf[start:end]``, or *start*."""
    q = end
    while q > start:
        p = max(start, q - _ZCHUNK)
        chunk = buf[p:q]
        if chunk != _ZEROS[: q - p]:
            return p + len(chunk.rstrip(b"\0"))
        q = p
    return start


def _common_size(sizes) -> int:
    """The size most files have (ties: the larger), as ``MappedFileQueue.load``."""
    return max(set(sizes), key=lambda n: (sizes.count(n), n))


def _rel(root: str, path: str) -> str:
    return os.path.relpath(path, root).replace(os.sep, "/")


def _queue_dirs(root: str):
    """``consumequeue.queue_dirs``; none where ``consumequeue`` is not a directory."""
    try:
        return queue_dirs(root)
    except NotADirectoryError:
        return []
