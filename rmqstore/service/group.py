"""Consumer-group membership across processes: the live members of a group
divide a topic's queues (RocketMQ's ``AllocateMessageQueueAveragely``), and
a member reads a queue only while it holds that queue's lease.

Leases are ``flock`` locks on files under
``<store>/config/consumerLeases/<topic>@<group>/`` (the name percent-encoded):

- ``member-<id>``: held by a member for its whole life. A member whose file
  can be locked by someone else is dead (the operating system releases a
  process's locks when it dies, by ``kill -9`` too); its file is removed by
  the first member that finds it so.
- ``queue-<id>``: held by the member reading that queue. A member lets go of
  a queue only between messages, after committing (and persisting) its
  progress, so the next holder starts where it stopped and no message is
  handed to two live members at once. Queue files are never removed
  (removing a lock file races with its next taker).

A broker does not look at these files (RocketMQ's brokers know their
consumers through heartbeats instead).
"""

from __future__ import annotations

import errno
import fcntl
import itertools
import os
import socket
import urllib.parse
import weakref

from ..storage.mapped_file import _NOFOLLOW
from .offsets import offset_key

__all__ = ["GroupMembership", "allocate_averagely"]

LEASE_DIR = os.path.join("config", "consumerLeases")
_FLAGS = os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0)
_ids = itertools.count()
# memberships of this process: a forked child closes its copies of their
# descriptors (a copy would keep a dead parent's leases held)
_live: weakref.WeakSet = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for m in list(_live):
        m._forget()
    _live.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def allocate_averagely(queues: list, members: list, member) -> list:
    """The queues *member* reads among *members* (both sorted the same way in
    every member), as RocketMQ's ``AllocateMessageQueueAveragely``: each
    member a contiguous run, the first ``len(queues) % len(members)``
    members one queue more; members past the queues get none."""
    n, m = len(queues), len(members)
    if member not in members or not n:
        return []
    i = members.index(member)
    mod = n % m
    size = 1 if n <= m else (n // m + 1 if mod and i < mod else n // m)
    start = i * size if mod and i < mod else i * size + mod
    return [queues[(start + j) % n] for j in range(min(size, n - start))]


def _try_lock(fd: int) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError as e:
        if e.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
            return False
        raise
    return True


class GroupMembership:
    """This member's place in consumer group *group* of *topic* over the
    store at *root* (see the module's doc). Joins on creation.

    Args:
        root (str): the store's root directory.
        group (str), topic (str): checked names.

    Attributes:
        member_id (str): ``<host>@<pid>@<n>``, unique among live members
            (RocketMQ's client id is ``<ip>@<pid>``).

    Raises OSError when the lease directory cannot be made or written.
    Not thread-safe: one consumer owns it.
    """

    def __init__(self, root: str, group: str, topic: str):
        self.dir = os.path.join(root, LEASE_DIR, urllib.parse.quote(offset_key(group, topic), safe=""))
        os.makedirs(self.dir, exist_ok=True)
        self._pid = os.getpid()
        self._queues: dict = {}  # queue id -> descriptor of its held lease
        while True:  # (a file left by a dead process of the same pid is free: it is ours now)
            self.member_id = f"{socket.gethostname()}@{self._pid}@{next(_ids)}"
            self._member_path = os.path.join(self.dir, "member-" + urllib.parse.quote(self.member_id, safe=""))
            fd = os.open(self._member_path, _FLAGS, 0o644)
            if _try_lock(fd):
                break
            os.close(fd)  # (held: a name that is not ours after all; the next one)
        self._member_fd: int | None = fd
        _live.add(self)

    def live_members(self) -> list:
        """The member ids of the live members, sorted (this one included).
        Files of dead members are removed on the way."""
        out = []
        for name in os.listdir(self.dir):
            if not name.startswith("member-"):
                continue
            member = urllib.parse.unquote(name[len("member-"):])
            path = os.path.join(self.dir, name)
            if path == self._member_path:
                out.append(member)
                continue
            try:
                # (read-write: where flock is emulated by fcntl locks, NFS, an
                # exclusive lock needs a descriptor open for writing)
                fd = os.open(path, os.O_RDWR | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0))
            except FileNotFoundError:
                continue  # (left meanwhile)
            try:
                if _try_lock(fd):  # nobody holds it: that member is gone
                    try:
                        os.unlink(path)
                    except OSError:  # (gone meanwhile, or a directory this process may not change)
                        pass
                else:
                    out.append(member)
            finally:
                os.close(fd)
        return sorted(out)

    def share(self, queues: list) -> list:
        """The queues of *queues* (sorted) this member is to read now."""
        return allocate_averagely(queues, self.live_members(), self.member_id)

    def acquire(self, queue_id: int) -> bool:
        """Take the lease of *queue_id* unless another member holds it
        (which then lets go at its next rebalance); returns whether held."""
        if queue_id in self._queues:
            return True
        if self._member_fd is None:  # (left the group)
            return False
        fd = os.open(os.path.join(self.dir, f"queue-{queue_id}"), _FLAGS, 0o644)
        if _try_lock(fd):
            self._queues[queue_id] = fd
            return True
        os.close(fd)
        return False

    def release(self, queue_id: int) -> None:
        """Let go of *queue_id*'s lease (its progress committed first)."""
        fd = self._queues.pop(queue_id, None)
        if fd is not None:
            os.close(fd)

    @property
    def held(self) -> list:
        """The queue ids whose leases this member holds, sorted."""
        return sorted(self._queues)

    def close(self) -> None:
        """Leave the group: every lease released, the member file removed;
        idempotent. In a forked child, only the descriptors are closed."""
        for q in list(self._queues):
            self.release(q)
        fd, self._member_fd = self._member_fd, None
        if fd is None:
            return
        try:
            if os.getpid() == self._pid:
                try:
                    os.unlink(self._member_path)  # (while locked: a tester then finds it gone)
                except FileNotFoundError:
                    pass
        finally:
            os.close(fd)

    def _forget(self) -> None:
        """In a forked child: close the descriptors, touch no file."""
        for fd in list(self._queues.values()) + [self._member_fd]:
            if fd is not None:
                os.close(fd)
        self._queues.clear()
        self._member_fd = None

    def __del__(self):
        # an abandoned consumer must not hold its leases for the process's life
        if getattr(self, "_member_fd", None) is not None:
            try:
                self.close()
            except OSError:  # pragma: no cover - nothing to report to at collection
                pass
