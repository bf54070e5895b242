"""The writer lock of a store directory, and what a fork does to the stores
of the process (docs/recovery.md#writer-lock-and-abort-file)."""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import threading
import weakref

from ..exceptions import StoreLockedError
from ..storage.mapped_file import _NOFOLLOW, open_no_follow

#: ``struct flock`` of 64-bit Linux (type, whence, start, len, pid), for
#: asking who holds the lock without taking it; None elsewhere
_GETLK = "hh4xqqi4x" if sys.platform.startswith("linux") and struct.calcsize("P") == 8 else None

# writable stores open in this process, by the (device, inode) of their
# directory: fcntl locks do not exclude the same process, and one directory
# has many paths (a symbolic link, a rename, a bind mount)
_open_writers: set = set()
_open_writers_lock = threading.Lock()
# every open store of this process: a forked child must not use them
_open_stores: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    """In a forked child: every store the parent had open is closed here
    (its calls raise StoreClosedError; nothing is written, the parent's
    lock and files are untouched), and the child may open stores itself."""
    for store in list(_open_stores):
        store._forked()
    _open_stores.clear()
    _open_writers.clear()
    global _open_writers_lock
    _open_writers_lock = threading.Lock()  # (a parent thread may have held it at the fork)


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


class StoreLock:
    """The writer lock of a store directory (RocketMQ's ``lock`` file): an
    exclusive fcntl lock on ``<root_dir>/lock``, plus this process's
    registry of open writers, which knows a directory by its device and
    inode (fcntl locks do not exclude the same process, and a directory may
    be reached by several paths). :meth:`MessageStore.open` takes it for a
    writable store; jobs that rewrite or swap a store's files (the Spark
    writer and rebuilds) take it to keep writers out. Use as a context
    manager or ``acquire()``/``release()``. The ``lock`` file is never
    reached through a symbolic link.

    Raises StoreLockedError (from ``acquire``) when a writer holds the store,
    in this process or another; CorruptedFileError when ``lock`` is a
    symbolic link."""

    def __init__(self, root_dir):
        self.root_dir = os.fspath(root_dir)
        self._key = None
        self._fd = -1

    def acquire(self) -> StoreLock:
        with _open_writers_lock:
            st = os.stat(self.root_dir)
            key = (st.st_dev, st.st_ino)
            if key in _open_writers:
                raise StoreLockedError(f"store {self.root_dir} is already open for writing in this process")
            flags = os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
            fd = open_no_follow(os.path.join(self.root_dir, "lock"), flags, 0o644)
            try:
                fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
            except OSError:
                os.close(fd)
                raise StoreLockedError(f"store {self.root_dir} is locked by another process") from None
            try:
                if os.pread(fd, 4, 0) != b"lock":  # (the same bytes: an existing lock file is left as it was)
                    os.pwrite(fd, b"lock", 0)
                    os.fsync(fd)
            except BaseException:
                os.close(fd)
                raise
            _open_writers.add(key)
            self._key = key
            self._fd = fd
        return self

    @staticmethod
    def is_held(root_dir) -> bool:
        """Whether a writer holds the store in *root_dir* now, in this process
        or another (for read-only tools; it creates no file and, on 64-bit
        Linux, takes no lock: ``F_GETLK`` asks who holds it. Elsewhere the
        lock is taken for an instant when free, so a writer opening at that
        very moment is refused, as by any other holder)."""
        root_dir = os.fspath(root_dir)
        with _open_writers_lock:
            st = os.stat(root_dir)
            if (st.st_dev, st.st_ino) in _open_writers:
                return True
            mode = os.O_RDONLY if _GETLK is not None else os.O_RDWR  # (a reader may not write the store)
            try:
                fd = open_no_follow(os.path.join(root_dir, "lock"), mode | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0),
                                    0o644)
            except FileNotFoundError:
                return False
            try:
                if _GETLK is not None:
                    answer = fcntl.fcntl(fd, fcntl.F_GETLK, struct.pack(_GETLK, fcntl.F_WRLCK, 0, 0, 1, 0))
                    return struct.unpack(_GETLK, answer)[0] != fcntl.F_UNLCK
                try:
                    fcntl.lockf(fd, fcntl.LOCK_EX | fcntl.LOCK_NB, 1, 0)
                except OSError:
                    return True
                return False
            finally:
                os.close(fd)  # (drops a probe's lock)

    def release(self) -> None:
        if self._fd >= 0:
            os.close(self._fd)  # closing the descriptor drops the fcntl lock
            self._fd = -1
            with _open_writers_lock:
                _open_writers.discard(self._key)

    def _forget(self) -> None:
        """In a forked child: the parent holds the lock; keep its descriptor
        (closing a copy drops nothing, but the child has no business with it)."""
        self._fd = -1

    def __enter__(self) -> StoreLock:
        return self.acquire()

    def __exit__(self, *exc) -> None:
        self.release()

