"""A pull consumer over one store: read, hand out, commit (at-least-once).

:class:`Consumer` is what :meth:`MessageStore.consumer` returns. It plays the
part of a RocketMQ consumer of one group subscribed to one topic (clustering
mode): the live members of the group, in any process, divide the topic's
queues and rebalance as members come and go (:mod:`rmqstore.service.group`),
with the broker's offset table as its offset store
(``RemoteBrokerOffsetStore`` + ``ConsumerOffsetManager``).
"""

from __future__ import annotations

import collections
import logging
import math
import time
from typing import Any

from ..exceptions import (
    IllegalMessageError,
    MessageTypeError,
    StoreClosedError,
)
from ..format.layout import DLQ_GROUP_TOPIC_PREFIX, PROPERTY_RETRY_TOPIC, RETRY_GROUP_TOPIC_PREFIX
from ..message import GetMessageStatus, MessageExt, _check_int
from ..store.args import _wait_arg
from .offsets import _check_name, _check_queue_id, offset_key
from .retry import MAX_RECONSUME_TIMES, retry_topic, send_back_message, spool_send_back

__all__ = ["Consumer"]

log = logging.getLogger("rmqstore.consumer")

_I32_MAX = (1 << 31) - 1
#: seconds between looks at the group's members (RocketMQ rebalances every
#: 20 s and when told a member came or went; here a look is a directory
#: listing and a lock attempt per member)
_REBALANCE = 1.0
#: seconds before trying again for a queue whose last holder has not let go
_RETRY_LEASE = 0.05
#: messages handed out between two looks at the clock for a rebalance (a
#: drained or waiting consumer looks at every wake)
_LOOK_EVERY = 64

# statuses after which a queue has nothing more to give right now
_EMPTY = frozenset({
    GetMessageStatus.OFFSET_OVERFLOW_ONE,
    GetMessageStatus.NO_MESSAGE_IN_QUEUE,
    GetMessageStatus.NO_MATCHED_LOGIC_QUEUE,
})


class Consumer:
    """Iterate over the messages of *topic* that consumer group *group* has not
    consumed yet, committing its progress (at-least-once delivery); with
    *wait_ms*, wait for new ones.

    Each queue starts at the group's committed offset (see
    :meth:`MessageStore.get_committed_offset`), or at the queue's first stored
    message when the group never committed one (RocketMQ's
    CONSUME_FROM_FIRST_OFFSET for a new group).

    Group: without *queue_ids* the consumer is a member of *group* and
    reads its share of the topic's queues (RocketMQ's
    ``AllocateMessageQueueAveragely`` over the live members, in this process
    or others: writers and read-only followers alike), each under a lease
    (a ``flock`` the operating system releases when the process dies). It
    looks at the members about once a second, and between messages only,
    after committing, lets go of queues no longer its share, so no message
    is in two live members' hands at once. With *queue_ids* it reads
    exactly those queues, outside the group's division.

    Messages are pulled in batches
    of *batch* per queue and handed out one at a time, taking the queues in
    turn (round robin: one message of each queue that has one, then the next
    round), in queue-offset order within a queue.

    Delivery contract: the message returned by ``next()`` is *in flight* until
    the caller asks for the following one; asking means "processed", and the
    offset after it is committed then, before the next message is returned.
    So a crash (or an exception in the caller's loop) re-delivers at most the
    in-flight message of the crashed consumer; nothing is skipped. Messages a
    tag filter leaves out count as consumed.

    Waiting: with *wait_ms* None iteration ends (``StopIteration``) as soon
    as every queue is drained. With *wait_ms* a number of milliseconds, a
    drained consumer waits up to that long for a new message in any of its
    queues (on the store's arrival signal in the writer's process, no busy
    loop; a read-only store looks every ``follow_poll_interval`` ms) and
    iteration ends only after a wait that long found nothing; ``math.inf``
    waits until the consumer or the store is closed. A close from another
    thread, or of the store, ends a waiting iteration cleanly
    (``StopIteration``); a KeyboardInterrupt lands between messages: what was
    handed out before is committed first, nothing is in flight while waiting.

    A consumer can be iterated again later (a new ``for`` loop continues
    where the last one stopped, finding messages stored since), and a new
    consumer of the same group continues from the committed offsets, e.g.
    after a restart. Queues of the topic created later are found when
    *queue_ids* is None.

    Use :meth:`commit` to acknowledge the in-flight message when leaving a loop
    early after processing it, and :meth:`close` (or ``with``) at the end.

    Args:
        store (MessageStore): open; writable, or read-only in a process
            that follows the writer's (its commits are merged into the same
            file, see :class:`~rmqstore.service.offsets.ConsumerOffsetStore`).
        group (str), topic (str): non-empty, without ``@``.
        queue_ids (iterable[int] | None): the queues to read; None = this
            member's share of every queue the topic has (now and later).
        batch (int): messages pulled per queue at a time (RocketMQ
            ``pullBatchSize``, default 32), 1 .. 2**31-1.
        tags (str | list[str] | None): tag filter as in
            :meth:`MessageStore.get_messages` (``"TagA || TagB"``).
        sync (bool | None): whether each commit is on disk before the next
            message is returned; None = the offset store's default (True).
            False defers commits to the offset store's periodic persist (a
            crash then re-delivers what the last interval committed).
        wait_ms (int | float | None): how long a drained consumer waits for
            a new message, ms (see above); None = not at all, ``math.inf`` =
            until closed.

    Raises:
        MessageTypeError, IllegalMessageError: bad arguments; ArgumentError:
            a negative or NaN *wait_ms*.
        StoreClosedError: the store is closed, now or when iterating.
        OSError: the group's lease files cannot be made (a read-only file
            system, no permission on ``config/``).

    Not thread-safe: one thread iterates a consumer (another may
    :meth:`close` it, which wakes a waiting iteration).
    """

    def __init__(self, store, group: str, topic: str, queue_ids=None, batch: int = 32, tags=None, sync=None,
                 wait_ms=None, max_reconsume_times: int = MAX_RECONSUME_TIMES):
        _check_name("group", group)
        _check_name("topic", topic)
        if isinstance(batch, bool) or not isinstance(batch, int):
            raise MessageTypeError(f"batch must be an int in [1, {_I32_MAX}], got {type(batch).__name__}")
        if not 1 <= batch <= _I32_MAX:  # a pull's max_count
            raise IllegalMessageError(f"batch must be in [1, {_I32_MAX}], got {batch}")
        if queue_ids is not None:
            if isinstance(queue_ids, int):
                raise MessageTypeError("queue_ids must be an iterable of int or None")
            queue_ids = sorted({_check_queue_id(q) for q in queue_ids})
        if wait_ms is not None and wait_ms != math.inf:
            wait_ms = _wait_arg(wait_ms)
        max_reconsume_times = _check_int("max_reconsume_times", max_reconsume_times, minimum=0)
        if store.closed:
            raise StoreClosedError(f"store {store.root_dir} is closed")
        self.store = store
        self.group = group
        self.topic = topic
        self.batch = batch
        self.tags = tags
        self.sync = sync
        self.wait_ms = wait_ms
        self.max_reconsume_times = max_reconsume_times
        self._offsets = store.consumer_offsets()
        self._key = offset_key(group, topic)
        self._fixed = queue_ids
        self._topic_queues: list = []  # the topic's queues as last seen (group mode)
        self._queues: list = [] if queue_ids is None else list(queue_ids)
        self._membership = None
        self._next_rebalance = 0.0
        self._look_in = _LOOK_EVERY
        self._pos: dict = {}  # queue id -> next queue offset to pull
        self._acked: dict = {}  # queue id -> offset everything before which is processed or filtered out
        self._committed: dict = {}  # queue id -> offset last committed by us (or found committed)
        # queue ids whose _acked may differ from _committed (a commit per message looks at these only)
        self._dirty: set = set()
        self._buf: dict = {}  # queue id -> deque of pulled messages not handed out yet
        self._inflight: tuple | None = None  # (queue id, offset after the message last handed out)
        self._rr = 0
        self._closed = False
        self.delivered = 0  # messages handed out by this consumer
        # a member also consumes its group's retry topic (another Consumer, a member there too)
        self._retry: Consumer | None = None
        self._retry_out: Any = None  # the retry handed out by the step under way, until delivered
        if queue_ids is None:  # a member of the group: its share of the topic's queues, under leases
            from .group import GroupMembership

            self._membership = GroupMembership(store.root_dir, group, topic)
            try:
                self._rebalance()
                if not topic.startswith((RETRY_GROUP_TOPIC_PREFIX, DLQ_GROUP_TOPIC_PREFIX)):
                    self._retry = Consumer(store, group, retry_topic(group), batch=batch, sync=sync,
                                           max_reconsume_times=max_reconsume_times)
            except BaseException:
                self._membership.close()
                raise

    # --- queues and positions ---------------------------------------------------------

    def _discover(self) -> list:
        topic = self.topic
        return [q for t, q in self.store.queues() if t == topic]

    def _rebalance(self) -> None:
        """Group mode: read this member's share of the topic's queues now
        (see :mod:`rmqstore.service.group`). Queues no longer its share are
        let go after their progress is committed and persisted (nothing of
        theirs is in flight: this runs between messages); queues newly its
        share are taken once their last holder has let go."""
        membership = self._membership
        if membership is None:
            return
        self._topic_queues = self._discover()
        want = membership.share(self._topic_queues)
        lost = [q for q in membership.held if q not in want]
        if lost:
            self._commit_acked()
            self._offsets.flush()  # (deferred commits too: the next holder reads them from the file)
            for q in lost:
                membership.release(q)
                for d in (self._pos, self._acked, self._committed, self._buf):
                    d.pop(q, None)  # (pulled, not handed out: the next holder gets them)
                self._dirty.discard(q)
        self._queues = [q for q in want if membership.acquire(q)]
        # a share not fully held yet (a last holder still lets go) is looked at again soon
        self._next_rebalance = time.monotonic() + (_RETRY_LEASE if len(self._queues) < len(want) else _REBALANCE)

    def _rebalance_due(self) -> bool:
        return self._membership is not None and time.monotonic() >= self._next_rebalance

    def _rebalance_if_due(self) -> None:
        if self._rebalance_due():
            self._rebalance()

    def _wait_slice(self, left: float) -> float:
        """*left* seconds of waiting, cut at the next look at the group."""
        if self._membership is None:
            return left
        return min(left, max(0.0, self._next_rebalance - time.monotonic()))

    def _init_queue(self, q: int) -> None:
        c = self._offsets.get(self.group, self.topic, q)
        start = self.store.get_min_offset_in_queue(self.topic, q) if c is None else c
        self._pos[q] = self._acked[q] = start
        if c is not None:
            self._committed[q] = c
        self._buf[q] = collections.deque()

    def positions(self) -> dict:
        """``{queue_id: offset}``: where each queue seen so far goes on (the next
        message not handed out yet)."""
        out = {}
        for q, pos in self._pos.items():
            buf = self._buf[q]
            out[q] = buf[0].queue_offset if buf else pos
        return out

    def committed(self) -> dict:
        """``{queue_id: offset}`` committed for the queues seen so far (by this
        consumer, or found committed when it started)."""
        return dict(self._committed)

    @property
    def in_flight(self):
        """``(queue_id, queue_offset)`` of the message handed out and not yet
        acknowledged, or None."""
        if self._inflight is None:
            return None
        return self._inflight[0], self._inflight[1] - 1

    # --- iteration -----------------------------------------------------------------------

    def __iter__(self):
        return self

    def __next__(self) -> MessageExt:
        if self._closed or self.store.closed:
            self._ensure_open()  # raises
        retry = self._retry
        if self._inflight is not None or (retry is not None and retry._inflight is not None):
            self._ack_inflight()
        if self._dirty or (retry is not None and retry._dirty):
            self._commit_acked()
        m = None
        if self._membership is not None:
            # a look at the clock every _LOOK_EVERY messages: a clock read
            # costs as much as a message here (a VM's clock is a system call)
            self._look_in -= 1
            if self._look_in <= 0:
                self._look_in = _LOOK_EVERY
                if time.monotonic() >= self._next_rebalance:
                    self._rebalance()
                if retry is not None:  # (retries are not starved by a busy topic)
                    m = self._from_retry()
        # (inline, not _step and _deliver: a call per message is measurable)
        if m is None:
            m = self._next_message()
        else:
            self._deliver(m)
            return m
        if m is None:
            m = self._step()
            if m is None and self.wait_ms is not None:
                m = self._wait_for_message(self.wait_ms)
            if m is None:
                if not (self._closed or self.store.closed):  # (a close committed already)
                    self._commit_acked()  # progress made over filtered-out messages
                raise StopIteration
            if m is self._retry_out:
                self._deliver(m)
                return m
        self._inflight = (m.queue_id, m.queue_offset + 1)
        self.delivered += 1
        return m

    def _step(self):
        """The next message in turn, pulling what is needed, then one of the
        retry topic's; None when every queue is drained. Does not wait,
        commit or mark it in flight (a retry's consumer does: see
        :meth:`_from_retry`)."""
        m = self._next_message()
        if m is None and self._fixed is None and self._discover() != self._topic_queues:  # queues created since
            self._rebalance()
            m = self._next_message()
        if m is None and self._retry is not None:
            m = self._from_retry()
        return m

    def _from_retry(self):
        """The retry topic's next message (:meth:`_deliver` puts it in flight
        there), its topic the original one (``RETRY_TOPIC``, as RocketMQ's consumer resets it);
        None when it has none."""
        retry: Any = self._retry
        retry._rebalance_if_due()
        m = retry._step()
        if m is not None:
            self._retry_out = m
            m.topic = (m.properties or {}).get(PROPERTY_RETRY_TOPIC, m.topic)
        return m

    def _deliver(self, m) -> None:
        """*m* is handed out: in flight here, or a retry in the retry topic's consumer."""
        retry: Any = self._retry
        if m is self._retry_out:
            self._retry_out = None
            retry._inflight = (m.queue_id, m.queue_offset + 1)
        else:
            self._inflight = (m.queue_id, m.queue_offset + 1)
        self.delivered += 1

    def _wait_for_message(self, wait_ms):
        """Wait up to *wait_ms* for a message in any queue (see the class's
        doc); None when none came, or the consumer or the store closed."""
        deadline = time.monotonic() + wait_ms / 1000
        while True:
            self._commit_acked()  # (progress over filtered-out units: not held back by a long wait)
            left = deadline - time.monotonic()
            if left <= 0:
                return None
            # (members come and go while it waits: a look at the group now and then)
            self.store._wait_until(self._ready, self._wait_slice(left))
            if self._closed or self.store.closed:
                return None
            self._rebalance_if_due()
            m = self._step()
            if m is not None:
                return m

    def _ready(self) -> bool:
        """Whether a step may find something now: a queue grew past where
        this consumer is, the topic has a queue not seen yet, or the
        consumer was closed (to wake its waiting thread)."""
        if self._closed:
            return True
        store, topic, pos = self.store, self.topic, self._pos
        for q in self._queues:
            p = pos.get(q)
            if p is None or store.get_max_offset_in_queue(topic, q) > p:
                return True
        if self._retry is not None and self._retry._ready():
            return True
        return self._fixed is None and self._discover() != self._topic_queues

    def _next_message(self):
        queues = self._queues
        n = len(queues)
        if n:  # most calls: the next queue in turn has a pulled message waiting
            q = queues[self._rr % n]
            buf = self._buf.get(q)
            if buf:
                self._rr = (self._rr + 1) % n
                return buf.popleft()
        for i in range(n):
            q = queues[(self._rr + i) % n]
            m = self._take(q)
            if m is not None:
                self._rr = (self._rr + i + 1) % n
                return m
        return None

    def _take(self, q: int):
        if q not in self._pos:
            self._init_queue(q)
        buf = self._buf[q]
        if buf:
            return buf.popleft()
        # nothing of q is buffered or in flight: everything before pos is done
        self._acked[q] = max(self._acked[q], self._pos[q])
        self._dirty.add(q)  # (also for what the pulls below skip, and a new group's start)
        store, topic = self.store, self.topic
        while True:
            pos = self._pos[q]
            r = store.get_messages(topic, q, pos, self.batch, self.tags)
            if r.status is GetMessageStatus.FOUND:
                buf.extend(r.messages)
                self._pos[q] = r.next_begin_offset
                return buf.popleft()
            if r.status in _EMPTY:
                return None
            # NO_MATCHED_MESSAGE / MESSAGE_WAS_REMOVING: moved on past units it
            # skipped; OFFSET_TOO_SMALL / OFFSET_OVERFLOW_BADLY: corrected to the
            # queue's min / max offset (RocketMQ's broker-side correction)
            if r.status in (GetMessageStatus.OFFSET_TOO_SMALL, GetMessageStatus.OFFSET_OVERFLOW_BADLY):
                log.warning(
                    "group %s: %s queue %d offset %d is %s; moving to %d",
                    self.group, topic, q, pos, r.status.name, r.next_begin_offset,
                )
            nxt = r.next_begin_offset
            if nxt == pos:
                return None
            self._pos[q] = nxt
            self._acked[q] = nxt

    def _ack_inflight(self) -> None:
        """The message handed out last is processed (a retry: in its consumer)."""
        if self._retry is not None:
            self._retry._ack_inflight()
        if self._inflight is None:
            return
        q, nxt = self._inflight
        self._inflight = None
        acked = self._acked
        acked[q] = max(acked[q], nxt)
        if not self._buf[q] and self._pos[q] > acked[q]:
            acked[q] = self._pos[q]  # the rest of the batch was filtered out
        self._dirty.add(q)

    def _commit_acked(self, defer: bool = False) -> bool:
        """Commit the acknowledged progress of the queues that moved (*defer*:
        in memory only, the caller persists), the retry topic's too; returns
        whether any had."""
        acked, committed, dirty = self._acked, self._committed, self._dirty
        if self._retry is not None and self._retry._dirty:
            return self._retry._commit_acked(defer) | self._commit_acked(defer)
        if not dirty:
            return False
        if len(dirty) == 1:  # (a message at a time: its queue only)
            q = dirty.pop()
            if committed.get(q) == acked[q]:
                return False
            changed = {q: acked[q]}
        else:
            changed = {q: acked[q] for q in dirty if committed.get(q) != acked[q]}
            dirty.clear()
            if not changed:
                return False
        try:
            self._offsets._commit_checked(self._key, changed, False if defer else self.sync)
        except BaseException:
            dirty.update(changed)  # not committed (closed offset store, ...): the next commit tries again
            raise
        committed.update(changed)
        return True

    def _put_back(self, m) -> None:
        """Hand *m* out next after all: it was taken by a step whose caller
        went away (a cancelled task) before it was handed out."""
        retry: Any = self._retry
        if m is self._retry_out:  # (back to the retry topic's consumer, as it was read)
            self._retry_out = None
            m.topic = retry.topic
            retry._buf[m.queue_id].appendleft(m)
        elif m is not None:
            self._buf[m.queue_id].appendleft(m)

    # --- ending -------------------------------------------------------------------------

    def reconsume_later(self, msg, delay_level: int = 0):
        """Hand back *msg*, a message this consumer gave out whose processing
        failed, to be consumed again later (RocketMQ's ``RECONSUME_LATER``,
        the consumer's ``sendMessageBack``; docs/service.md#retries-and-dead-letters):
        it is stored again in ``%RETRY%<group>`` with delay level
        ``3 + reconsume times`` (or *delay_level* > 0), and this group's
        members get it again once the delay has passed; after
        ``max_reconsume_times`` reconsumes, or with *delay_level* < 0, it
        goes to ``%DLQ%<group>`` instead. The message still counts as
        processed when the next one is asked for (its offset is committed
        then, after the new record is stored).

        Returns the new record's :class:`PutMessageResult` (its topic
        ``SCHEDULE_TOPIC_XXXX`` for a retry, ``%DLQ%<group>`` for a dead
        letter).

        In a read-only store (a follower process) the send-back is left,
        fsynced, in ``config/sendBack/`` for the writer process, whose
        schedule service stores it within about a second (or the next
        writer, when none runs now); it returns None then.

        Raises StoreClosedError; MessageTypeError / IllegalMessageError for
        bad arguments; what a put raises (nothing is stored then: call it
        again); OSError (a follower's spool file)."""
        self._ensure_open()
        store = self.store
        if store.read_only:
            spool_send_back(store.root_dir, self.group, msg, delay_level, self.max_reconsume_times)
            return None
        record, _dead = send_back_message(msg, self.group, delay_level, self.max_reconsume_times)
        return store.put_message(record)

    def commit(self) -> None:
        """Acknowledge the in-flight message (processed) and commit every queue's
        progress now. Raises StoreClosedError, OSError (see
        :meth:`ConsumerOffsetStore.commit`)."""
        self._ensure_open()
        self._ack_inflight()
        self._commit_acked()

    def close(self) -> None:
        """Commit the acknowledged progress (not the in-flight message, which the
        group gets again) and stop; idempotent. Does nothing more when the
        store is already closed."""
        if self._closed:
            return
        self._closed = True
        self._inflight = None
        if self._retry is not None:
            self._retry.close()  # (its in-flight message, unacknowledged, comes again)
        try:
            if not self.store.closed:
                self._commit_acked()
                self._offsets.flush()  # (before the leases go: the next holder reads the file)
                self.store._wake_waiters()  # (an iteration waiting in another thread ends)
        finally:
            if self._membership is not None:
                self._membership.close()

    def _leave_group(self) -> None:
        """The store closed (or was dropped as by a crash): let the group's
        leases go, committing nothing more."""
        if self._membership is not None:
            self._membership.close()
        if self._retry is not None:
            self._retry._leave_group()

    @property
    def closed(self) -> bool:
        return self._closed

    def _ensure_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"consumer {self.group} of {self.topic} is closed")
        if self.store.closed:
            raise StoreClosedError(f"store {self.store.root_dir} is closed")

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        return (
            f"<Consumer group={self.group!r} topic={self.topic!r} queues={self._queues} "
            f"delivered={self.delivered}{' closed' if self._closed else ''}>"
        )
