"""Puts: one message, many, columns; every one through the core's Appender, the
rare events (a new queue or file, odd input) in ``_append_stepped``."""

from __future__ import annotations

import errno
import logging
import os

from .. import _kernels as k
from ..dispatch import gets_consume_queue_unit, tags_code
from ..exceptions import (
    CorruptedFileError,
    IllegalMessageError,
    MessageTooLargeError,
    MessageTypeError,
    PropertiesSizeExceededError,
    StoreClosedError,
)
from ..format.layout import (
    BORNHOST_V6_FLAG,
    CQ_STORE_UNIT_SIZE,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    MAX_TOPIC_LENGTH_V2,
    PROPERTY_CRC32,
    PROPERTY_DELAY,
    PROPERTY_KEYS,
    PROPERTY_UNIQ_KEY,
    STOREHOSTADDRESS_V6_FLAG,
)
from ..message import (
    _INT64,
    MESSAGE_TYPES,
    Message,
    PutColumnsResult,
    PutMessageResult,
    PutMessageStatus,
    _check_int,
    encode_host,
    offset_msg_id,
)
from ..service.schedule import to_schedule
from .args import MAX_OFFSET
from .recovery import Recovery

log = logging.getLogger("rmqstore.store")


class Put(Recovery):
    """The layer of the put calls (RocketMQ's ``DefaultMessageStore.putMessage``
    and ``putMessages``), each all or nothing: a put that fails leaves no
    byte of itself in any file."""

    def _prepare(self, msg):
        """Validate and encode what does not depend on the append position,
        from one reading of each of the message's attributes (they may be
        changed after the message was made, by this thread or another): the
        fields are checked again here, and a body that is not bytes is
        copied once, so its length and its bytes agree whatever happens to
        it meanwhile. Returns ``(topic, topic bytes, (queue_id, flag,
        born_timestamp, reconsume_times, prepared_transaction_offset),
        sys_flag, born host, store host, body, property blob, properties,
        record size, the message the Appender is asked to put)``: *msg*
        itself, or, for a delayed message, its rewrite into
        ``SCHEDULE_TOPIC_XXXX`` (docs/service.md#delayed-delivery), which the
        Appender puts as any other."""
        if not isinstance(msg, MESSAGE_TYPES):
            raise MessageTypeError(f"expected a Message, got {type(msg).__name__}")
        cfg = self.config
        topic = msg.topic
        if not isinstance(topic, str):
            raise MessageTypeError(f"topic must be a str, got {type(topic).__name__}")
        topic_b = self._check_topic(topic)
        body = msg.body
        if type(body) is not bytes:
            if not isinstance(body, (bytearray, memoryview)):
                raise MessageTypeError(f"body must be bytes-like, got {type(body).__name__}")
            body = bytes(body)
        if len(body) > cfg.max_message_size:
            raise MessageTooLargeError(f"body of {len(body)} bytes exceeds max_message_size {cfg.max_message_size}")
        born_ts = msg.born_timestamp
        fields = (
            _check_int("queue_id", msg.queue_id, minimum=0), _check_int("flag", msg.flag),
            None if born_ts is None else _check_int("born_timestamp", born_ts, _INT64),
            _check_int("reconsume_times", msg.reconsume_times),
            _check_int("prepared_transaction_offset", msg.prepared_transaction_offset, _INT64),
        )
        sys_flag = _check_int("sys_flag", msg.sys_flag) & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
        props = msg.property_map()
        if self._append_crc:
            props.pop(PROPERTY_CRC32, None)  # the store appends its own
        born_host, store_host = msg.born_host, msg.store_host
        asked = msg
        if PROPERTY_DELAY in props and cfg.schedule_service_enable:  # delayed: stored in SCHEDULE_TOPIC_XXXX
            moved = to_schedule(topic, fields[0], sys_flag, props, cfg.max_delay_level)
            if moved is not None:
                topic, qid = moved
                topic_b = self._check_topic(topic)
                fields = (qid, *fields[1:])
                asked = Message(topic, body, qid, fields[1], properties=props, born_timestamp=fields[2],
                                born_host=born_host, store_host=store_host, reconsume_times=fields[3],
                                sys_flag=sys_flag, prepared_transaction_offset=fields[4])
        props_b = msg.encode_properties(props)
        born_raw = self._store_host_raw if born_host is None else encode_host(born_host)
        store_raw = self._store_host_raw if store_host is None else encode_host(store_host)
        if len(born_raw) == 20:
            sys_flag |= BORNHOST_V6_FLAG
        if len(store_raw) == 20:
            sys_flag |= STOREHOSTADDRESS_V6_FLAG
        props_len = len(props_b)
        if self._append_crc:
            props_len += (1 if props_b and props_b[-1] != 2 else 0) + 20
            if props_len > MAX_PROPERTIES_LENGTH:
                raise PropertiesSizeExceededError(
                    f"properties of {props_len} bytes (with __CRC32#) exceed {MAX_PROPERTIES_LENGTH}"
                )
        size = k.record_size(sys_flag, len(body), len(topic_b), props_len, len(topic_b) > MAX_TOPIC_LENGTH_V1)
        if not self.commitlog.fits_in_new_segment(size):
            raise MessageTooLargeError(
                f"record of {size} bytes cannot fit in a {self.commitlog.file_size}-byte CommitLog file"
            )
        return (topic, topic_b, fields, sys_flag, born_raw, store_raw, body, props_b, props, size, asked)

    def check_message(self, msg: Message) -> int:
        """Validate *msg* as :meth:`put_message` would, writing nothing (for
        loaders that must refuse a whole batch before storing any of it).
        Returns the size in bytes its CommitLog record would take. Raises
        MessageTypeError, IllegalMessageError, MessageTooLargeError or
        PropertiesSizeExceededError, as put_message does."""
        return self._prepare(msg)[9]

    def check_messages(self, msgs) -> None:
        """Validate every message of *msgs* (an iterable of :class:`Message`)
        as :meth:`put_messages` would, writing nothing: the batch form of
        :meth:`check_message`, through the same kernel check as a put (a
        loader refusing a whole input before storing any of it). Raises
        what put_messages raises for the first message it refuses
        (MessageTypeError, IllegalMessageError, MessageTooLargeError,
        PropertiesSizeExceededError); StoreClosedError on a closed store."""
        msgs = list(msgs)
        fast = self._fast
        if fast is None:  # read-only (a put's kernel is a writer's): step by step
            self._ensure_open()
            for m in msgs:
                self._prepare(m)
            return
        with self._lock:
            self._validated(fast, msgs)

    def _validated(self, fast, msgs: list) -> tuple:
        """put_messages' validation of the list *msgs* (append lock held):
        ``(prepared, encoded)``, *prepared* the step-by-step encoding of each
        message the Appender refused (None for the others), *encoded* the
        Appender's own (for put_batch). Raises the first bad message's error."""
        # the Appender vouches for what it encodes itself (and keeps the
        # encoding for put_batch), _prepare checks and encodes the rest (a new
        # queue's, or a new store's, messages too: checked against the topic's
        # bytes and the CommitLog file size). Under the lock: every Appender
        # call is (they share its encoding scratch).
        refused, encoded = fast.check_all(msgs, self._topic_bytes, self.commitlog.file_size)
        prepared: list = [None] * len(msgs)
        for i in refused:
            prepared[i] = self._prepare(msgs[i])
        return prepared, encoded

    def _topic_bytes(self, topic: str):
        """The UTF-8 bytes of *topic* put_message would write, None when it
        refuses the topic (check_all's view of a topic with no bound queue:
        its messages are then prepared in order, which raises the first bad
        message's error, whatever it is)."""
        try:
            return self._check_topic(topic)
        except IllegalMessageError:
            return None

    def _check_topic(self, topic: str) -> bytes:
        """The UTF-8 bytes of a valid topic: validated once, then cached
        (topics are few). Raises IllegalMessageError."""
        topic_b = self._topics.get(topic)
        if topic_b is not None:
            return topic_b
        try:
            topic_b = topic.encode("utf-8")
        except UnicodeEncodeError:
            raise IllegalMessageError(f"topic {topic!r} has no UTF-8 form (a lone surrogate)") from None
        if len(topic_b) > MAX_TOPIC_LENGTH_V1 and not self.config.auto_message_version_on_topic_len:
            raise IllegalMessageError(f"topic of {len(topic_b)} UTF-8 bytes is over 127")
        if len(topic_b) > MAX_TOPIC_LENGTH_V2:
            raise IllegalMessageError(f"topic of {len(topic_b)} UTF-8 bytes is over {MAX_TOPIC_LENGTH_V2}")
        if "/" in topic or "\x00" in topic or topic in (".", ".."):
            raise IllegalMessageError(f"topic {topic!r} cannot name a ConsumeQueue directory")
        name_max, path_room = self._name_limits()
        if len(topic_b) > name_max or len(topic_b) > path_room:
            raise IllegalMessageError(
                f"topic of {len(topic_b)} UTF-8 bytes cannot name a ConsumeQueue directory under {self.root_dir} "
                f"(the file system takes names of up to {name_max} bytes, and paths of up to "
                f"{path_room} more bytes there)"
            )
        if len(self._topics) >= 4096:  # bound the cache against endless distinct topics
            self._topics.clear()
        self._topics[topic] = topic_b
        return topic_b

    def _name_limits(self) -> tuple:
        """``(longest file name, bytes a topic may take in a path)`` on the
        store's file system: ``consumequeue/<topic>/<queue id>/<20 digits>``
        must fit PATH_MAX under the root (asked once, POSIX minimums
        where the system does not say)."""
        limits = self._limits
        if limits is None:
            try:
                name_max = os.pathconf(self.root_dir, "PC_NAME_MAX")
                path_max = os.pathconf(self.root_dir, "PC_PATH_MAX")
            except (OSError, ValueError):
                name_max, path_max = 255, 4096
            name_max = name_max if name_max and name_max > 0 else 255
            path_max = path_max if path_max and path_max > 0 else 4096
            # "<root>/consumequeue/" + topic + "/2147483647/" + 20 digits, and the NUL
            fixed = len(os.fsencode(self.root_dir)) + len("/consumequeue/") + len("/2147483647/") + 20 + 1
            limits = self._limits = (name_max, path_max - fixed)
        return limits

    def _plan_prepared(self, prepared, plan=None) -> list:
        """What prepared messages (:meth:`_prepare`'s tuples) need of the
        files, added to *plan* (``Appender.plan``'s form, made if None):
        ``[total record bytes, the largest record's bytes, records,
        {(topic, queue_id): records that get a ConsumeQueue unit}, index
        keys]``."""
        if plan is None:
            plan = [0, 0, 0, {}, 0]
        counts = plan[3]
        for topic, _tb, fields, sys_flag, _born, _store, _body, _blob, props, size, _asked in prepared:
            plan[0] += size
            if size > plan[1]:
                plan[1] = size
            plan[2] += 1
            if gets_consume_queue_unit(sys_flag):
                key = (topic, fields[0])
                counts[key] = counts.get(key, 0) + 1
            plan[4] += self._index_keys(sys_flag, props.get(PROPERTY_UNIQ_KEY), props.get(PROPERTY_KEYS))
        return plan

    def _reserve(self, plan) -> None:
        """Make every file the records of *plan* (:meth:`_plan_prepared`)
        need before the first of them is written, so that writing them
        cannot fail half way for a file that cannot be made: the CommitLog
        segments they roll into, each queue's files (and, for a new queue,
        its directory) and the index files their keys roll into. RocketMQ
        makes its next CommitLog file ahead in the same way; files made
        ahead wait as spares for the rolls that take them. Under SYNC_FLUSH
        what is appended but not yet dispatched counts too. Raises what
        making a file raises (DiskFullError, OSError, CorruptedFileError)
        with no record written. The append lock is held."""
        total, biggest, count, counts, n_keys = plan
        if count:
            self.commitlog.reserve(total, biggest, count)
        for key, n in counts.items():
            known = self._cqs.get(key)
            cq = self._new_consume_queue(*key) if known is None else known
            first = self._queue_offsets.get(key, 0)
            cq.reserve(first, first + n)
            if known is None:  # (registered once its files exist)
                self._cqs[key] = cq
        if count and self.config.message_index_enable:
            self.index.reserve(n_keys + self._pending_keys)

    def _mark(self) -> tuple:
        """Where the CommitLog ends now and the bookkeeping :meth:`_undo` to
        here restores (taken under the append lock before a put writes)."""
        return self.commitlog.max_offset(), self._written_end, self._last_store_ts, self._last_logics_ts

    def _undo(self, mark) -> None:
        """A put raised after it began writing (an interrupt, or anything
        :meth:`_reserve` could not foresee): remove what it wrote since
        *mark* — the records from that physical offset on, their units and
        index entries, the files made for them — and restore the
        bookkeeping, so the store is as before the put and a retry stores
        no duplicate. If the undo itself fails the store takes no more
        writes (reopening recovers it). The append lock is held."""
        w0 = mark[0]
        cl = self.commitlog
        try:
            firsts: dict = {}  # (topic, queue_id) -> the first queue offset undone
            try:
                for phy, _size in cl.iter_offsets(w0):
                    f = cl.read(phy, with_body=False)
                    if f is None:
                        break
                    if gets_consume_queue_unit(f[7]):
                        firsts.setdefault((f[15], f[3]), f[5])
            except CorruptedFileError:  # (a record torn by the failure itself: nothing after it is ours)
                pass
            with self._dispatch_lock:
                pending = self._pending
                while pending and pending[-1][3] >= w0:
                    pending.pop()
                self._pending_keys = sum(self._index_keys(p[5], p[8], p[9]) for p in pending)
                for key, cq in list(self._cqs.items()):
                    if key in firsts or cq.max_physic_offset > w0:
                        cq.truncate_dirty_logic_files(w0)
                        self._queue_offsets[key] = firsts.get(key, cq.max_offset_in_queue())
                    if not cq.queue.files:  # a queue this put made (or reserved): no trace of it
                        self._queue_offsets.pop(key, None)
                        cq.remove_directory()
                if self.config.message_index_enable and self.index.files:
                    self.index.truncate(w0, lambda phy: cl.store_timestamp_at(phy, 1))
            cl.forget(cl.undo_to(w0, cl.max_record_size))
            if self._fast is not None:  # its bindings may name files the undo deleted
                self._fast.unbind()
                self._rebind()
            self._written_end, self._last_store_ts, self._last_logics_ts = mark[1:]
            self._flushed_where = min(self._flushed_where, w0)
            self.checkpoint.confirm_phy_offset = min(self.checkpoint.confirm_phy_offset, w0)
        except BaseException as e:
            err = e if isinstance(e, OSError) else OSError(errno.EIO, f"undo of a failed put: {e!r}")
            self._fail_write(err)
            log.exception("could not undo a failed put in %s", self.root_dir)

    def _append(self, prepared, store_ts=None) -> PutMessageResult:
        """Append one prepared message step by step; the caller holds the
        append lock. The record joins the pending-dispatch queue in CommitLog
        order. *store_ts*: the store time the caller already took (one clock
        reading per record, whichever path writes it)."""
        if store_ts is None:
            store_ts = self._clock()
        topic, topic_b, (qid, flag, born_ts, reconsume, prepared_off), sys_flag, born_raw, store_raw, body, props_b, \
            props, size, _asked = prepared
        consumed = gets_consume_queue_unit(sys_flag)  # (the dispatch rules: docs/recovery.md#dispatch)
        key = (topic, qid)
        queue_offset = self._queue_offsets.get(key, 0) if consumed else 0
        if born_ts is None:
            born_ts = store_ts
        phy = self.commitlog.append(
            size, qid, flag, queue_offset, sys_flag, born_ts, born_raw, store_ts, store_raw,
            reconsume, prepared_off, body, topic_b, props_b, self._append_crc,
        )
        if consumed:
            self._queue_offsets[key] = queue_offset + 1
        self._written_end = phy + size
        self._last_store_ts = store_ts
        uniq, keys = props.get(PROPERTY_UNIQ_KEY), props.get(PROPERTY_KEYS)
        self._pending.append((topic, qid, queue_offset, phy, size, sys_flag, store_ts,
                              tags_code(topic, props, store_ts, self.config), uniq, keys))
        self._pending_keys += self._index_keys(sys_flag, uniq, keys)
        return PutMessageResult(
            PutMessageStatus.PUT_OK, offset_msg_id(store_raw, phy), phy, size, queue_offset, store_ts
        )

    def _append_declined(self, prepared, store_ts) -> PutMessageResult:
        """One message the Appender declined, its files made (:meth:`_reserve`;
        append lock held): the one place where a put leaves the core's path.
        The CommitLog rolls here when the record does not fit its last
        segment (or takes its first), the index takes its first file, the
        Appender is pointed at the files and the queue made for it (a new
        queue's first message, a queue or an index past a file's end under
        SYNC_FLUSH) and asked again; what it declines again (an index roll,
        where a record's keys may straddle two files; a message it does not
        vouch for) goes step by step (:meth:`_append_stepped`).
        *prepared*: :meth:`_prepare`'s tuple for the message (whose last
        item is what the Appender is asked for); *store_ts*: the store time
        already read for it."""
        fast = self._fast
        if fast is not None:
            self.commitlog.segment_for(prepared[9])  # a CommitLog roll, or the store's first segment
            if self.config.message_index_enable and not self.index.files and not self._sync_flush:
                self.index.writable_file()  # the store's first index file (SYNC_FLUSH: its dispatch's)
            self._bind_queue(prepared[0], prepared[2][0])
            result = fast.put(prepared[10], store_ts)  # (*msg*, or its rewrite)
            if result is not None:
                self._appended(result[2] + result[3], store_ts)
                return result
        return self._append_stepped(prepared, store_ts)

    def _bind_queue(self, topic, queue_id) -> None:
        """Point the Appender at the file of *queue_id* of *topic* its next
        unit goes into, and at the last CommitLog and index files. Under
        ASYNC_FLUSH, where the Appender writes units itself, a queue whose
        last file is full (or that has none yet: a new queue) takes its next
        file from the spares :meth:`_reserve` made."""
        if not self._sync_flush:
            cq = self._cqs.get((topic, queue_id))
            if cq is not None:
                cq.queue.last_for_append(self._queue_offsets.get((topic, queue_id), 0) * CQ_STORE_UNIT_SIZE)
        self._rebind(topic, queue_id)

    def _appended(self, end: int, store_ts: int) -> None:
        """The store's bookkeeping after the Appender wrote records through
        CommitLog physical offset *end*, the last stored at *store_ts*."""
        self._written_end = end
        self._last_store_ts = store_ts
        if self._fast.unit_timestamp >= 0:  # (the Appender dispatches what it writes; a prepared record: no unit)
            self._last_logics_ts = self._fast.unit_timestamp
        if self._waiting:
            self._wake_waiters()

    def _append_stepped(self, prepared, store_ts=None) -> PutMessageResult:
        """A put the Appender declined, step by step (append lock held):
        append, dispatch at once under ASYNC_FLUSH (SYNC_FLUSH: once
        flushed, in _commit), and point the Appender at the files and the
        queue that may have been created."""
        result = self._append(prepared, store_ts)
        if not self._sync_flush:
            self._dispatch_pending(MAX_OFFSET)
        if self._fast is not None:
            self._rebind(prepared[0], prepared[2][0])
        return result

    def _rebind(self, topic=None, queue_id=None) -> None:
        """Point the put path (``k.Appender``) at the files a put writes now:
        the last CommitLog and index files and, given one, the last file of
        the queue the step-by-step path just wrote. Called under the append
        lock after that path, which may have created or rolled any of them;
        the Appender itself never creates a file. Under SYNC_FLUSH, where
        units and index entries are written once flushed, a queue or an
        index with no file yet is bound to the file made for it ahead (a
        spare), and a queue to the file its next unit goes into."""
        fast = self._fast
        sync = self._sync_flush
        files = self.commitlog.queue.files
        fast.bind_commit_log(files[-1] if files else None)
        if self.config.message_index_enable:
            files = self.index.files or (self.index.spares[:1] if sync else [])
            fast.bind_index(files[-1] if files else None)
        if topic is not None:
            cq = self._cqs.get((topic, queue_id))
            topic_b = self._topics.get(topic)
            if cq is not None and topic_b is not None:
                files = cq.queue.files
                mf = files[-1] if files else None
                if sync:
                    at = self._queue_offsets.get((topic, queue_id), 0) * CQ_STORE_UNIT_SIZE
                    mf = next((f for f in (*files[-1:], *cq.queue.spares)
                               if f.file_from_offset <= at < f.file_from_offset + f.file_size), mf)
                fast.bind_queue(topic, queue_id, topic_b, cq, mf)

    def _put_one(self, msg, store_ts=None, commit: bool = True) -> PutMessageResult:
        """put_message for what the put gate's Appender declined (a new queue
        or file, a message it does not vouch for, which _prepare checks and
        refuses or encodes; a closed store): every file the record needs is
        made first (:meth:`_reserve`), the Appender is asked again
        (:meth:`_append_declined`), and a failure after the first byte is
        written undoes it. Under SYNC_FLUSH it returns once the
        record is on disk, unless *commit* is False (the put gate, which
        holds the append lock, then waits after releasing it)."""
        self._ensure_writable()
        if self._disk_full:
            self._refuse_if_disk_full()
        prepared = self._prepare(msg)
        with self._lock:
            self._ensure_open()
            self._check_write_error()
            self._reserve(self._plan_prepared([prepared]))
            mark = self._mark()
            try:
                result = self._append_declined(prepared, self._clock() if store_ts is None else store_ts)
            except BaseException:
                self._undo(mark)
                raise
        if self._sync_flush and commit:
            self._commit(result.wrote_offset + result.wrote_bytes)
        if prepared[10] is not msg:  # (moved to SCHEDULE_TOPIC_XXXX by its DELAY)
            self._scheduled()
        return result

    def _scheduled(self) -> None:
        """A message was stored delayed: the schedule service looks now
        (starting, at the store's first)."""
        schedule = self._schedule
        if schedule is not None:
            schedule.wake()

    def put_messages(self, msgs) -> list:
        """Put each message of *msgs* (an iterable of :class:`Message`) under one
        append lock, as separate records (and, under SYNC_FLUSH, one sync).
        All or nothing: every message is validated and every file the batch
        needs is made before the first record is written, and a failure
        after that (an interrupt included) undoes what the call wrote, so a
        caller may retry the whole batch. Returns the list of
        :class:`PutMessageResult`; raises what :meth:`put_message` raises."""
        self._ensure_writable()
        if self._disk_full:
            self._refuse_if_disk_full()
        fast = self._appender()
        msgs = list(msgs)
        with self._lock:
            prepared, encoded = self._validated(fast, msgs)  # validated first
            self._ensure_open()
            self._check_write_error()
            own = [p for p in prepared if p is not None]
            plan = fast.plan(encoded, bool(own))
            if own:
                plan = self._plan_prepared(own, plan)
            if plan is not None:
                self._reserve(plan)
            mark = self._mark()
            try:
                results = self._append_batch(fast, msgs, prepared, encoded)
            except BaseException:
                self._undo(mark)
                raise
        if self._sync_flush and results:
            self._commit(results[-1].wrote_offset + results[-1].wrote_bytes)
        # (only a message the Appender refused can have been rewritten: most batches have none)
        if prepared.count(None) < len(prepared) and any(
                p is not None and p[10] is not m for p, m in zip(prepared, msgs)):
            self._scheduled()
        return results

    def _appender(self):
        """The Appender, or StoreClosedError (close drops it)."""
        fast = self._fast
        if fast is None:
            self._ensure_open()
            raise StoreClosedError(f"store {self.root_dir} is closed")
        return fast

    def _append_batch(self, fast, msgs, prepared, encoded) -> list:
        """put_messages' appends (append lock held): the Appender's
        put_batch as far as it goes (with check_all's *encoded*),
        :meth:`_append_declined` where it declines, one clock reading per
        message either way."""
        results: list = []
        clock = self._kernel_clock
        i = 0
        while True:
            done = len(results)
            i, store_ts = fast.put_batch(msgs, i, clock, results, encoded)  # as far as the Appender goes
            if len(results) > done:  # (_append_declined keeps its own record's books)
                self._appended(results[-1][2] + results[-1][3], results[-1][5])
            if i >= len(msgs):
                break
            results.append(self._append_declined(prepared[i] or self._prepare(msgs[i]), store_ts))
            i += 1
        return results

    def put_message_columns(
        self, topic: str, bodies, queue_ids=0, tags=None, keys=None, unique_keys=None
    ) -> PutColumnsResult:
        """Bulk form of :meth:`put_messages` for callers holding columns: row
        *i* is ``Message(topic, bodies[i], queue_id=queue_ids[i], tags=tags[i],
        keys=keys[i], unique_key=unique_keys[i])``, stored as its own record,
        all under one append lock with one store timestamp (RocketMQ stamps a
        batch once; born timestamp = store timestamp), and under SYNC_FLUSH
        one sync. The rows go through one kernel call
        (``Appender.put_columns``), no Python object per message; rows
        needing a new file or queue, the step-by-step path.

        Args:
            topic (str): one topic for every row.
            bodies (sequence of bytes-like): the bodies.
            queue_ids (int | sequence of int): one queue for all, or one per row.
            tags, keys, unique_keys (None | str | sequence of str|None): one
                value for all rows, or one per row (None: no such property).
                Keys are space-separated (RocketMQ's KEYS).

        Returns a :class:`PutColumnsResult` (numpy arrays, one row per message).

        Raises what :meth:`put_messages` raises for the row's Message, before
        anything is written; ValueError when a column's length differs.
        """
        import numpy as np

        bodies = list(bodies)
        n = len(bodies)
        cols = []
        for name, col in (("queue_ids", queue_ids), ("tags", tags), ("keys", keys), ("unique_keys", unique_keys)):
            if col is None or isinstance(col, (int, str)):
                col = None if col is None else [col] * n
            else:
                col = col.tolist() if hasattr(col, "tolist") else list(col)  # numpy ints become ints
                if len(col) != n:
                    raise ValueError(f"{name} has {len(col)} rows, bodies has {n}")
            cols.append(col)
        qids, tags_c, keys_c, uniq_c = cols
        if qids is None:
            raise MessageTypeError("queue_ids must be an int or a sequence of ints")

        def message(i: int) -> Message:
            return Message(topic, bodies[i], queue_id=qids[i], tags=None if tags_c is None else tags_c[i],
                           keys=None if keys_c is None else keys_c[i],
                           unique_key=None if uniq_c is None else uniq_c[i])

        phys, sizes, qoffs = np.zeros(n, np.int64), np.zeros(n, np.int64), np.zeros(n, np.int64)
        self._ensure_writable()
        if self._disk_full:
            self._refuse_if_disk_full()
        fast = self._appender()
        with self._lock:
            # validated first (under the lock, as put_messages): the kernel
            # vouches for the rows it encodes itself, the rest are checked as
            # the Message they stand for (and kept so)
            own: dict = {}
            i, encoded = 0, None
            while i < n:  # (the kernel keeps its encodings for put_columns)
                i, encoded = fast.check_columns(topic, bodies, qids, tags_c, keys_c, uniq_c, i, encoded,
                                                self._topic_bytes, self.commitlog.file_size)
                if i < n:
                    own[i] = self._prepare(message(i))
                    i += 1
            self._ensure_open()
            self._check_write_error()
            plan = None if encoded is None else fast.plan(encoded, bool(own))
            if own:
                plan = self._plan_prepared(list(own.values()), plan)
            if plan is not None:
                self._reserve(plan)  # (all or nothing, as put_messages)
            mark = self._mark()
            ts = self._clock()
            i = 0
            try:
                while i < n:
                    i = fast.put_columns(topic, bodies, qids, tags_c, keys_c, uniq_c, i, ts, phys, sizes, qoffs,
                                         encoded)
                    if i < n:  # declined (a new file or queue, odd input): this row as its Message, then on
                        m = message(i)
                        r = self._append_declined(own.get(i) or self._prepare(m), ts)
                        phys[i], sizes[i], qoffs[i] = r.wrote_offset, r.wrote_bytes, r.queue_offset
                        i += 1
            except BaseException:
                self._undo(mark)
                raise
            if n:  # rows are stored in order: the last one ends the CommitLog
                self._written_end = int(phys[-1] + sizes[-1])
                self._last_store_ts = ts
                if not self._sync_flush:  # (every row got its unit: dispatched; SYNC_FLUSH's in _commit)
                    self._last_logics_ts = ts
                if self._waiting:
                    self._wake_waiters()
        if self._sync_flush and n:
            self._commit(int(phys[-1] + sizes[-1]))
        return PutColumnsResult(PutMessageStatus.PUT_OK, phys, sizes, qoffs, ts)
