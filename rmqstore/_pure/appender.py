"""The put path: ``append_dispatch`` (record, unit and index keys in one
call), the ``Appender`` that validates, encodes and writes a message per
call (applying the dispatch rules of ``put_path``), and the store's
``AppendLock``."""

from __future__ import annotations

import functools
import operator
import threading
import time
from typing import Any

from ..format.layout import (
    BORNHOST_V6_FLAG,
    CQ_STORE_UNIT_SIZE,
    MAX_PROPERTIES_LENGTH,
    MAX_TOPIC_LENGTH_V1,
    SCHEDULE_TOPIC,
    STOREHOSTADDRESS_V6_FLAG,
)
from .codec import _I64, _encoded_props_len, _fields, record_size, tags_hash, write_record
from .consumequeue import _check_unit_pos, cq_put
from .index import _check_index_buf, _check_keys, _index_count, _index_keys, index_put
from .message import MESSAGE_FIELDS
from .put_path import delay_level, gets_consume_queue_unit, gets_index_entries
from .state import StoreState


def _index_takes(index_buf, hash_slot_num: int, index_num: int, physical_offset: int, n_keys: int,
                 key_prefix=None, keys=None) -> bool:
    """Whether the index file in *index_buf* takes *n_keys* more entries
    for a record being appended at *physical_offset*: one past the file's
    end physical offset (what it indexed last, or what the file before it
    did), or the store's first record at 0 into a file with no entry yet
    (a new store's first index file, whose end is 0 too). With *keys*,
    first the checks a write of them needs (their types, a writable
    buffer), which raise as ``index_put_keys`` does."""
    if keys is not None:
        _check_keys(key_prefix, keys)
        if memoryview(index_buf).readonly:
            raise TypeError(f"argument must be read-write bytes-like object, not {type(index_buf).__name__}")
    _check_index_buf(index_buf, hash_slot_num, index_num)
    end, count = _I64.unpack_from(index_buf, 24)[0], _index_count(index_buf)
    fresh = physical_offset == 0 and end == 0 and count <= 1
    return (physical_offset > end or fresh) and count + n_keys <= index_num


def _put_keys(index_buf, hash_slot_num: int, index_num: int, prefix: str, keys: list, physical_offset: int,
              store_timestamp: int) -> None:
    """Put ``prefix + key`` for each of *keys*, a record's, which
    :func:`_index_takes` found the file takes (all of them fit, and none is
    there yet: no end offset check, unlike ``index_put_keys``)."""
    for key in keys:
        index_put(index_buf, hash_slot_num, index_num, prefix + key, physical_offset, store_timestamp)


def append_dispatch(
    buf, pos: int, queue_id: int, flag: int, queue_offset: int, physical_offset: int, sys_flag: int,
    born_timestamp: int, born_host, store_timestamp: int, store_host, reconsume_times: int,
    prepared_transaction_offset: int, body, topic, properties, append_crc: bool,
    cq_buf, cq_pos: int, tags_code: int, index_buf, hash_slot_num: int, index_num: int, key_prefix: str, keys: list,
) -> int:
    """One put in one call (ASYNC_FLUSH's dispatch done at append time):
    ``write_record`` with the first 17 arguments, then the ConsumeQueue unit
    (``cq_put(cq_buf, cq_pos, physical_offset, size, tags_code)``), then, when
    *index_buf* is not None, ``index_put_keys(index_buf, hash_slot_num,
    index_num, key_prefix, keys, physical_offset, store_timestamp)``. Written
    in that order (what a crash leaves is a prefix recovery can finish).

    Returns the record size, or 0 with nothing written when the index file
    cannot take every key or its end physical offset is at or past
    *physical_offset* (the caller then takes the step-by-step path), unless
    both are 0 and the file holds no entry (a new store's first record into
    its first index file). Every check comes first: errors (as the three
    kernels raise them) write nothing.
    """
    _fields(
        (queue_id, 32), (flag, 32), (queue_offset, 64), (physical_offset, 64), (sys_flag, 32),
        (born_timestamp, 64), (store_timestamp, 64), (reconsume_times, 32), (prepared_transaction_offset, 64),
        (tags_code, 64),
    )
    if index_buf is not None and not _index_takes(index_buf, hash_slot_num, index_num, physical_offset, len(keys),
                                                  key_prefix, keys):
        return 0
    if memoryview(cq_buf).readonly:
        raise TypeError(f"argument must be read-write bytes-like object, not {type(cq_buf).__name__}")
    _check_unit_pos(cq_buf, cq_pos)
    size = write_record(
        buf, pos, queue_id, flag, queue_offset, physical_offset, sys_flag, born_timestamp, born_host,
        store_timestamp, store_host, reconsume_times, prepared_transaction_offset, body, topic, properties,
        append_crc,
    )
    cq_put(cq_buf, cq_pos, physical_offset, size, tags_code)
    if index_buf is not None:
        _put_keys(index_buf, hash_slot_num, index_num, key_prefix, keys, physical_offset, store_timestamp)
    return size


# --- the put path ---------------------------------------------------------


def _int(value, bits: int) -> int:
    """*value* as the field's integer (TypeError / OverflowError as _core's)."""
    v = operator.index(value)
    if not -(1 << (bits - 1)) <= v < (1 << (bits - 1)):
        raise OverflowError(f"{v} does not fit in {bits} bits")
    return v


# the Message fields the put path reads
_SLOTS = MESSAGE_FIELDS


def _encoded(encoded) -> _Encoded | None:
    if encoded is not None and type(encoded) is not _Encoded:
        raise TypeError("encoded must be what check_all or check_columns returned")
    return encoded


def _for_columns(enc: _Encoded, topic, bodies) -> bool:
    """Whether check_columns made *enc* for this topic and bodies column."""
    return enc.topic is not None and enc.topic is topic and enc.of is bodies and len(enc.encodings) == len(bodies)


class _Encoded:
    """What Appender.check_all encoded of one list of messages (*of*, its
    items as a tuple), or check_columns of one set of columns (*of* the
    bodies list, *topic* theirs): _encode's tuple per item, None where none."""

    __slots__ = ("of", "encodings", "topic")

    def __init__(self, of, encodings: list, topic=None):
        self.of, self.encodings, self.topic = of, encodings, topic


def _placeholder_of(topic_b):
    """check_all's and check_columns' stand-in binding for the unbound
    queues of a topic: ``(topic_b, None, None)`` (no binding is it, so
    put_batch / put_columns encode its messages afresh once a queue is
    bound), None unless *topic_b* is bytes (the store refuses the topic)."""
    return (topic_b, None, None) if type(topic_b) is bytes else None


def _one_call_at_a_time(method):
    """An Appender put call refused while another one runs (the store makes
    them under its append lock, so on this thread): a put started by Python
    code inside one (a finalizer, a signal handler, the store's clock) gets
    a RuntimeError, as in the core (whose calls keep the files' positions in
    C until they end); the store's lock is reentrant (RocketMQ's), so only
    this catches it."""

    @functools.wraps(method)
    def call(self, *args, **kwargs):
        if self._entered:
            raise RuntimeError("a put started inside another put of this store (from a finalizer, "
                               "a signal handler or the store's clock) is refused")
        self._entered = True
        self._unit_timestamp = -1
        try:
            return method(self, *args, **kwargs)
        finally:
            self._entered = False

    return call


class Appender:
    """The put path of one writable store: ``put(msg, store_timestamp)``
    validates and encodes a :class:`~rmqstore.message.Message`, writes its
    CommitLog record, its ConsumeQueue unit and its index keys
    (``append_dispatch``'s bytes and order) and returns the
    ``PutMessageResult`` in one call (ASYNC_FLUSH). With *dispatch* False
    (SYNC_FLUSH, where RocketMQ 5.3.2+ dispatches only what is on disk) it
    writes the record alone, takes the queue offset from *queue_offsets*,
    and appends ``(topic, queue_id, queue_offset, physical_offset, size,
    sys_flag, store_timestamp, tags_code, unique_key, keys)`` to
    ``state.pending`` (adding its index entries to ``state.pending_keys``)
    for the store to dispatch once the record is flushed; it declines a
    record whose unit or index entries would not fit the bound files then
    (with what is pending before it), so that the store makes those files
    first.

    The caller binds the files a put may write, all of them the last of
    their kind, and rebinds after anything else writes them:
    ``bind_commit_log(mapped_file)`` (attributes ``mm``, ``file_from_offset``,
    ``file_size``, ``wrote_position``), ``bind_index(index_file)`` (``mm``,
    ``hash_slot_num``, ``index_num``) and, per queue, ``bind_queue(topic,
    queue_id, topic_bytes, consume_queue, mapped_file)`` (the queue's
    ``max_physic_offset``; *topic_bytes* the validated UTF-8 topic, *None*
    for *mapped_file* unbinds). ``unbind()`` drops every binding. Positions
    are read from and written back to those objects on each put, and
    *queue_offsets* (the store's ``{(topic, queue_id): next queue offset}``)
    is read and advanced, so the Python layer's view stays exact.

    The queue offset a put takes is the index of the unit it writes (the
    queue file's offset plus write position, over 20), as ConsumeQueue
    layout defines it; *queue_offsets* is advanced to match.

    ``put`` returns None, having written nothing, whenever the store's
    step-by-step path must take the message: a message whose type is not
    exactly *message_type* (a subclass may redefine attributes) or with a
    slot never set, an unbound queue or no bound
    CommitLog file, a record that does not fit the file (a roll), a full
    index file, a message with a host the store has not learnt, a DELAY
    of ``SCHEDULE_TOPIC_XXXX`` that is not a number, or anything the
    step-by-step path rejects (types, sizes, a shorthand contradicting its
    property): that path raises the typed error. It raises only for bound
    files that are not writable or smaller than their size (TypeError,
    ValueError).

    The dispatch rules are the put path's own: a transactional prepared
    or rollback record gets no ConsumeQueue unit (queue offset 0), a
    rollback no index entries; a unit of ``SCHEDULE_TOPIC_XXXX`` with a
    DELAY level above 0 gets the delivery time as its tags code (store
    time plus the level's delay from *delay_levels*, the level capped at
    the last; docs/format.md#delay-rule). ``unit_timestamp`` is the store
    time of the last record the latest put call gave a unit, -1 if none
    (the store's logics time, docs/recovery.md#checkpoint-fields).

    Not thread-safe: its callers serialize their calls (the store's append
    lock). The core keeps a call's file bytes and positions in C and writes
    the positions back when the call ends; a put made from within a call
    (by *clock*, a finalizer or a signal handler, writing to the same
    store) gets a RuntimeError.

    Args (constructor):
        message_type (type): the Message class whose instances go this way
            (exactly that class, or either implementation's Message here;
            the core takes only its own Message).
        result_type (type): a tuple subclass built as ``(ok_status, msg_id,
            physical_offset, size, queue_offset, store_timestamp)``.
        ok_status: its first field.
        store_host (bytes): raw store host field (8 bytes, 20 for IPv6).
        append_crc (bool): append the ``__CRC32#`` property.
        max_message_size (int): bodies above this many bytes go the
            step-by-step way (which refuses them).
        index_enable (bool): index UNIQ_KEY and KEYS.
        queue_offsets (dict): shared with the caller, see above.
        host_bytes (callable or None): a host string's raw field (the
            store's ``encode_host``), for messages with their own hosts.
        delay_levels (sequence of int or None): the delay in ms of each
            delay level from 1 on (``StoreConfig.message_delay_level``);
            None leaves every message of ``SCHEDULE_TOPIC_XXXX`` with a
            DELAY to the step-by-step path.
        dispatch (bool): write units and index keys with each record
            (True), or leave them to the store through *state* (False).
        state (StoreState): the store's, whose ``pending`` collection
            and ``pending_keys`` count the records left to dispatch
            (needed with *dispatch* False; TypeError without one).
    """

    def __init__(self, message_type, result_type, ok_status, store_host, append_crc, max_message_size,
                 index_enable, queue_offsets, host_bytes=None, delay_levels=None, dispatch=True, state=None):
        if not isinstance(message_type, type) or not isinstance(result_type, type) or \
                not issubclass(result_type, tuple):
            raise TypeError("message_type must be a class and result_type a tuple subclass")
        if type(store_host) is not bytes or len(store_host) not in (8, 20):
            raise ValueError("store_host must be the raw 8- or 20-byte host field")
        if not isinstance(queue_offsets, dict):
            raise TypeError("queue_offsets must be a dict")
        if not dispatch and type(state) is not StoreState:
            raise TypeError("an Appender that does not dispatch needs the store's StoreState")
        self._dispatch, self._state = bool(dispatch), state
        self._message_type: Any = message_type
        from ..message import MESSAGE_TYPES  # (message imports this module)

        # either implementation's Message: the twin reads public attributes
        self._fast_types = frozenset((message_type, *MESSAGE_TYPES))
        self._result_type = result_type
        self._ok = ok_status
        self._store_host = store_host
        self._append_crc = bool(append_crc)
        self._max_message_size = operator.index(max_message_size)
        self._index_enable = bool(index_enable)
        self._entered = False  # inside a call (see _one_call_at_a_time)
        self._queue_offsets = queue_offsets
        self._host_bytes = host_bytes
        self._queues: dict = {}
        self._commit: Any = None  # the bound MappedFile
        self._index: Any = None  # the bound IndexFile
        # (a level above 0 is found only with the table given)
        self._delays: tuple = () if delay_levels is None else tuple(_int(d, 64) for d in delay_levels)
        self._delay_table = delay_levels is not None
        self._unit_timestamp = -1

    @property
    def unit_timestamp(self) -> int:
        return self._unit_timestamp

    @property
    def dispatch(self) -> bool:
        return self._dispatch

    def bind_commit_log(self, mapped_file) -> None:
        self._commit = mapped_file

    def bind_index(self, index_file) -> None:
        if index_file is not None:
            _check_index_buf(index_file.mm, index_file.hash_slot_num, index_file.index_num)
        self._index = index_file

    def bind_queue(self, topic, queue_id, topic_bytes, consume_queue, mapped_file) -> None:
        if type(topic_bytes) is not bytes:
            raise TypeError("topic_bytes must be bytes")
        if mapped_file is None:
            self._queues.pop((topic, queue_id), None)
        else:
            self._queues[(topic, queue_id)] = (topic_bytes, consume_queue, mapped_file)

    def unbind(self) -> None:
        self._queues.clear()
        self._commit = self._index = None

    def _properties(self, msg):
        """(blob, tags, keys, unique key, delay level) as Message.property_map
        and encode_properties make them (the level of a DELAY of
        SCHEDULE_TOPIC_XXXX, else 0), or None where those would raise or a
        DELAY is not for this path."""
        tags, keys, uniq = msg.tags, msg.keys, msg.unique_key
        level = 0
        pairs = []
        seen = set()
        props = msg.properties
        if props is not None:
            if type(props) is not dict:
                return None
            for name, value in props.items():
                if type(name) is not str or type(value) is not str:
                    return None
                if name in ("TAGS", "KEYS", "UNIQ_KEY"):
                    given = {"TAGS": tags, "KEYS": keys, "UNIQ_KEY": uniq}[name]
                    if given is not None and given != value:
                        return None
                    seen.add(name)
                    if name == "TAGS":
                        tags = value
                    elif name == "KEYS":
                        keys = value
                    else:
                        uniq = value
                elif self._append_crc and name == "__CRC32#":
                    continue
                elif name == "DELAY":
                    if msg.topic != SCHEDULE_TOPIC:
                        return None  # (a delayed message: the step-by-step path moves it to SCHEDULE_TOPIC_XXXX)
                    if not self._delay_table:
                        return None
                    level = delay_level(value, len(self._delays))
                    if level < 0:
                        return None  # (the step-by-step path keeps the tags code, with a warning)
                pairs.append((name, value))
        for name, value in (("TAGS", tags), ("KEYS", keys), ("UNIQ_KEY", uniq)):
            if value is not None and name not in seen:
                if type(value) is not str:
                    return None
                pairs.append((name, value))
        try:
            blob = "".join([f"{n}\x01{v}\x02" for n, v in pairs]).encode("utf-8")
        except UnicodeError:
            return None
        # an empty name or a separator inside one (the message's attributes
        # may have changed since it was made): the step-by-step path raises
        if blob.count(1) != len(pairs) or blob.count(2) != len(pairs) or not all(n for n, _ in pairs):
            return None
        if len(blob) > MAX_PROPERTIES_LENGTH:
            return None
        return blob, tags, keys, uniq, level

    def _encode(self, msg: Any, unbound=None):
        """What a put takes from the message alone, or None when it is not
        for this path: (key, bound, sys_flag, fields, blob, tags,
        index_keys, body, body_len, size, delay level, unique key, keys),
        *bound* the queue's binding.
        With *unbound* (check_all's placeholders by topic), a message of an
        unbound queue is encoded against its topic's placeholder, and no
        CommitLog or index file need be bound."""
        if (self._commit is None and unbound is None) or type(msg) not in self._fast_types:
            return None  # (subclasses may redefine attributes: step by step)
        try:
            for name in _SLOTS:
                getattr(msg, name)
        except AttributeError:  # a slot never set
            return None
        # exact types only (the core reads the slots without a reference
        # of its own, so no user code may run mid-encode); others go step by step
        if not (type(msg.topic) is str and type(msg.queue_id) is int and type(msg.flag) is int and
                type(msg.reconsume_times) is int and type(msg.sys_flag) is int and
                type(msg.prepared_transaction_offset) is int and
                (msg.born_timestamp is None or type(msg.born_timestamp) is int) and
                (msg.tags is None or type(msg.tags) is str) and (msg.keys is None or type(msg.keys) is str) and
                (msg.unique_key is None or type(msg.unique_key) is str)):
            return None
        if msg.queue_id < 0:
            return None  # (no queue has one: the step-by-step path raises)
        if msg.delay_level is not None:
            return None  # (a delay shorthand: the step-by-step path moves the message to SCHEDULE_TOPIC_XXXX)
        key = (msg.topic, msg.queue_id)
        bound = self._queues.get(key)
        if bound is None and unbound is not None:
            bound = unbound.get(msg.topic)
        born, store = self._host(msg.born_host), self._host(msg.store_host)
        if bound is None or born is None or store is None:
            return None
        try:
            sys_flag = _int(msg.sys_flag, 32) & ~(BORNHOST_V6_FLAG | STOREHOSTADDRESS_V6_FLAG)
            fields = (
                _int(msg.queue_id, 32), _int(msg.flag, 32), _int(msg.reconsume_times, 32),
                _int(msg.prepared_transaction_offset, 64),
                None if msg.born_timestamp is None else _int(msg.born_timestamp, 64),
            )
        except (TypeError, OverflowError):
            return None
        if len(born) == 20:
            sys_flag |= BORNHOST_V6_FLAG
        if len(store) == 20:
            sys_flag |= STOREHOSTADDRESS_V6_FLAG
        encoded = self._properties(msg)
        if encoded is None:
            return None
        blob, tags, keys, uniq, level = encoded
        props_field = _encoded_props_len(blob, self._append_crc)
        if props_field > MAX_PROPERTIES_LENGTH:
            return None
        index_keys: list = []
        if self._index_enable:
            if self._index is None and unbound is None:
                return None
            if gets_index_entries(sys_flag):
                index_keys = _index_keys(uniq, keys)
        body = msg.body
        try:
            if type(body) is not bytes:  # one snapshot of a mutable body: its size and bytes agree
                body = bytes(memoryview(body))
            body_len = len(body)
        except (TypeError, BufferError):
            return None
        topic_b = bound[0]
        size = record_size(sys_flag, body_len, len(topic_b), props_field, len(topic_b) > MAX_TOPIC_LENGTH_V1)
        return key, bound, sys_flag, fields + (born, store), blob, tags, index_keys, body, body_len, size, level, \
            uniq, keys

    def _host(self, host):
        """The raw host a message's born_host / store_host stands for: the
        store's for None, ``host_bytes(host)`` for a str (8 or 20 bytes),
        else None (the step-by-step path encodes it, or raises its error)."""
        if host is None:
            return self._store_host
        if type(host) is not str or self._host_bytes is None:
            return None
        try:
            raw = self._host_bytes(host)
        except Exception:  # noqa: BLE001 (whatever it raises, the step-by-step path raises in order)
            return None
        return raw if type(raw) is bytes and len(raw) in (8, 20) else None

    def _checked(self, msg: Any, unbound=None, file_size=0):
        """_encode's tuple for a message :meth:`check` takes, else None (with
        check_all's *unbound*, a record must fit *file_size* where no
        CommitLog file is bound)."""
        e = self._encode(msg, unbound)
        limit = self._commit.file_size if self._commit is not None else file_size
        return e if e is not None and e[8] <= self._max_message_size and e[9] + 8 <= limit else None

    def check(self, msg: Any) -> bool:
        """True when ``put`` takes *msg* wherever the files stand, that is:
        the message is valid and fits in an empty CommitLog file (for
        callers that validate a batch before writing any of it)."""
        return self._checked(msg) is not None

    def check_all(self, msgs, topic_bytes=None, file_size=None) -> tuple:
        """:meth:`check` of each message of the list *msgs* (TypeError unless
        a list): ``(the indices it refuses, in order, what it encoded)``.
        Pass the second to :meth:`put_batch` on the same list, which then
        encodes each message no second time: a message is read once, when
        checked.

        With *topic_bytes* (a callable) and *file_size* (ints; both or
        neither, else TypeError), a message is checked as if its queue and
        the CommitLog file were bound: against the topic's UTF-8 bytes as
        ``topic_bytes(topic)`` gives them (called once per topic of an
        unbound queue; anything but bytes: the store refuses the topic, and
        so does this) and a CommitLog file of *file_size* bytes. What it
        takes that way is valid (the step-by-step path would take it too),
        and put_batch encodes it afresh once its queue is bound: a batch's
        first message of a new queue goes step by step, which binds the
        queue, and the rest of that queue's messages follow in put_batch."""
        if type(msgs) is not list:
            raise TypeError("msgs must be a list")
        if (topic_bytes is None) != (file_size is None):
            raise TypeError("topic_bytes and file_size go together")
        unbound: dict | None = None if topic_bytes is None else {}
        size = 0 if file_size is None else operator.index(file_size)
        encodings = []
        for m in msgs:
            e = self._checked(m, unbound, size)
            # a new queue's topic: learnt, then checked again
            if e is None and unbound is not None and self._placeholder(m, topic_bytes, unbound):
                e = self._checked(m, unbound, size)
            encodings.append(e)
        enc = _Encoded(tuple(msgs), encodings)
        return [i for i, e in enumerate(enc.encodings) if e is None], enc

    def plan(self, encoded, always=False):
        """What the messages *encoded* (:meth:`check_all` or
        :meth:`check_columns`' second result) need of the files, for the
        store to make every file a batch needs before it writes any of it:
        ``[total record bytes, the largest record's bytes, records,
        {(topic, queue_id): records}, index keys]`` over the messages it
        encoded (the store adds the others). None, unless *always*, when
        the bound files take them all as they stand (no roll, no new queue
        or file), as the next put call would find them; call it under the
        lock the puts take."""
        enc = _encoded(encoded)
        if enc is None:
            raise TypeError("encoded must be what check_all or check_columns returned")
        total = biggest = count = n_keys = 0
        counts: dict = {}
        fits = self._commit is not None and self._dispatch  # (else: files for the dispatch later)
        for e in enc.encodings:
            if e is None:
                continue
            key, bound, size = e[0], e[1], e[9]
            total += size
            biggest = max(biggest, size)
            count += 1
            n_keys += len(e[6])
            if self._queues.get(key) is not bound:  # a new queue, or rebound since
                fits = False
            if gets_consume_queue_unit(e[2]):  # (else a transaction's prepared or rollback record: no unit)
                counts[key] = counts.get(key, 0) + 1
        if fits:
            for key, n in counts.items():
                cmf = self._queues[key][2]
                pos = cmf.wrote_position
                room = (cmf.file_size - pos) // CQ_STORE_UNIT_SIZE if 0 < pos <= cmf.file_size else 0
                if n > room:
                    fits = False
                    break
        if fits:
            fits = total + 8 <= self._commit.file_size - self._commit.wrote_position  # END_FILE_MIN_BLANK_LENGTH
        if fits and self._index_enable and n_keys:
            index = self._index
            fits = index is not None and _index_count(index.mm) + n_keys <= index.index_num
        return None if fits and not always else [total, biggest, count, counts, n_keys]

    def _placeholder(self, msg, topic_bytes, unbound: dict) -> bool:
        """After check_all refused *msg*: when its queue (an exact str topic,
        an exact int queue id) is not bound, a placeholder binding for its
        topic in *unbound*, made once per topic (:func:`_placeholder_of`);
        True when it made one (check the message again)."""
        if type(msg) not in self._fast_types:
            return False
        topic, queue_id = getattr(msg, "topic", None), getattr(msg, "queue_id", None)
        if type(topic) is not str or type(queue_id) is not int:
            return False
        if topic in unbound or (topic, queue_id) in self._queues:
            return False
        unbound[topic] = _placeholder_of(topic_bytes(topic))
        return unbound[topic] is not None

    def _bound(self, e):
        """*e* (an encoding kept by check_all / check_columns) while its
        queue is bound as when it was made, else None."""
        return e if e is not None and self._queues.get(e[0]) is e[1] else None

    @_one_call_at_a_time
    def put_batch(self, msgs, start, clock, results: list, encoded=None):
        """:meth:`put` of ``msgs[start:]`` (a list) in order, each stamped by
        one reading of *clock* (None: the wall clock, ms since the epoch)
        taken before its put, each result appended to *results*. Stops at
        the first message ``put`` declines and returns ``(its index, the
        reading it got)`` for the step-by-step path to use;
        ``(len(msgs), None)`` when none declines, ``(start, None)`` with no
        bound CommitLog file. One put call's semantics per message: the
        core holds the files' bytes once for the whole batch.

        *encoded* (None, or :meth:`check_all`'s second result for this
        list): a message still at its index whose queue is bound as it was
        when checked is written as it was encoded then; any other is
        encoded afresh. TypeError for anything else."""
        if type(msgs) is not list:
            raise TypeError("msgs must be a list")
        enc = _encoded(encoded)
        if enc is not None and (enc.topic is not None or len(enc.of) != len(msgs)):
            enc = None  # (another list's)
        i = operator.index(start)
        if self._commit is None or i >= len(msgs):
            return i, None
        while i < len(msgs):
            ts = _wall_ms() if clock is None else clock()
            msg = msgs[i]
            e = self._bound(enc.encodings[i]) if enc is not None and msg is enc.of[i] else None
            if e is None:
                e = self._encode(msg)
            r = None if e is None else self._write(e, ts)
            if r is None:
                return i, ts
            results.append(r)
            i += 1
        return i, None

    @_one_call_at_a_time
    def put(self, msg: Any, store_timestamp):
        e = self._encode(msg)
        return None if e is None else self._write(e, store_timestamp)

    def _write(self, e: tuple, store_timestamp):
        """put of what _encode made of a message."""
        key, (topic_b, cq, cmf), sys_flag, fields, blob, tags, index_keys, body, body_len, size, level, uniq, keys = e
        # the dispatch rules: a unit unless a transaction's prepared or rollback record
        unit = gets_consume_queue_unit(sys_flag)
        if self._index_enable and self._index is None:
            return None
        queue_id, flag, reconsume, prepared, born_ts, born_host, store_host = fields
        try:
            store_ts = _int(store_timestamp, 64)
        except (TypeError, OverflowError):
            return None
        if born_ts is None:
            born_ts = store_ts
        if body_len > self._max_message_size:
            return None
        mf = self._commit
        pos = mf.wrote_position
        if pos < 0 or size + 8 > mf.file_size - pos:  # END_FILE_MIN_BLANK_LENGTH
            return None
        phy = mf.file_from_offset + pos
        index = self._index if self._index_enable else None
        if len(mf.mm) < mf.file_size:
            raise ValueError("a bound file is smaller than its file size")
        # the tags code, by the delay rule for a DELAY level of SCHEDULE_TOPIC_XXXX
        code = store_ts + self._delays[level - 1] if level > 0 else tags_hash(tags)
        if not self._dispatch:  # the record alone: the store dispatches it once flushed
            qo = 0
            if unit:
                qo = self._queue_offsets.get(key, 0)
                if type(qo) is not int:
                    return None
                # its unit, written once flushed, must fit the bound file (which the units before it fill first)
                if not cmf.file_from_offset <= qo * CQ_STORE_UNIT_SIZE <= \
                        cmf.file_from_offset + cmf.file_size - CQ_STORE_UNIT_SIZE:
                    return None
            st = self._state
            if index is not None and not _index_takes(index.mm, index.hash_slot_num, index.index_num, phy,
                                                      len(index_keys) + st.pending_keys):
                return None  # (with the entries of the records before it)
            write_record(mf.mm, pos, queue_id, flag, qo, phy, sys_flag, born_ts, born_host, store_ts, store_host,
                         reconsume, prepared, body, topic_b, blob, self._append_crc)
            mf.wrote_position = pos + size
            if unit:
                self._queue_offsets[key] = qo + 1
            st.pending.append((key[0], queue_id, qo, phy, size, sys_flag, store_ts, code, uniq, keys))
            st.pending_keys += len(index_keys)
        elif not unit:  # the record and its index keys (none for a rollback)
            qo = 0
            if index is not None and not _index_takes(index.mm, index.hash_slot_num, index.index_num, phy,
                                                      len(index_keys), key[0] + "#", index_keys):
                return None  # the index file cannot take every key here (every check before the first byte)
            write_record(mf.mm, pos, queue_id, flag, qo, phy, sys_flag, born_ts, born_host, store_ts, store_host,
                         reconsume, prepared, body, topic_b, blob, self._append_crc)
            if index is not None:
                _put_keys(index.mm, index.hash_slot_num, index.index_num, key[0] + "#", index_keys, phy, store_ts)
            mf.wrote_position = pos + size
        else:
            # the next queue offset is the next unit's index, as the last file's
            # position says (queue_offsets holds the same; it is written back)
            cq_pos = cmf.wrote_position
            if cq_pos < 0 or cq_pos > cmf.file_size - CQ_STORE_UNIT_SIZE or cq_pos % CQ_STORE_UNIT_SIZE:
                return None
            if cq_pos == 0:  # an empty file: its first unit only where the store's next queue offset is
                qo = self._queue_offsets.get(key, 0)
                if type(qo) is not int or qo * CQ_STORE_UNIT_SIZE != cmf.file_from_offset:
                    return None
            qo = (cmf.file_from_offset + cq_pos) // CQ_STORE_UNIT_SIZE
            if phy + size <= cq.max_physic_offset:
                return None
            if len(cmf.mm) < cmf.file_size:
                raise ValueError("a bound file is smaller than its file size")
            wrote = append_dispatch(
                mf.mm, pos, queue_id, flag, qo, phy, sys_flag, born_ts, born_host, store_ts, store_host, reconsume,
                prepared, body, topic_b, blob, self._append_crc, cmf.mm, cq_pos, code,
                None if index is None else index.mm, 0 if index is None else index.hash_slot_num,
                0 if index is None else index.index_num, key[0] + "#", index_keys,
            )
            if not wrote:
                return None  # the index file cannot take every key here
            mf.wrote_position = pos + size
            cmf.wrote_position = cq_pos + CQ_STORE_UNIT_SIZE
            cq.max_physic_offset = phy + size
            self._queue_offsets[key] = qo + 1
            self._unit_timestamp = store_ts
        msg_id = (store_host + _I64.pack(phy)).hex().upper()
        return tuple.__new__(self._result_type, (self._ok, msg_id, phy, size, qo, store_ts))


    # columns: one Message per row, through check and put

    def _row(self, topic, bodies, queue_ids, tags, keys, unique_keys, i):
        body, qid = bodies[i], queue_ids[i]
        values = [None if c is None else c[i] for c in (tags, keys, unique_keys)]
        if type(body) not in (bytes, bytearray, memoryview) or type(qid) is not int:
            return None
        if any(v is not None and type(v) is not str for v in values):
            return None
        try:
            return self._message_type(topic, body, queue_id=qid, tags=values[0], keys=values[1],
                                      unique_key=values[2])
        except (TypeError, ValueError):  # the typed errors Message raises derive from these
            return None

    def check_columns(self, topic, bodies, queue_ids, tags, keys, unique_keys, start, encoded=None,
                      topic_bytes=None, file_size=None) -> tuple:
        """:meth:`check` over rows ``start..`` of columns (lists of one length:
        *bodies* bytes-like, *queue_ids* ints, *tags*/*keys*/*unique_keys*
        None or lists of str/None), each row the Message of those fields:
        returns ``(the index of the first row check refuses, or len(bodies)
        when none; what it encoded)``. Pass the second back to go on after
        a refused row (*encoded*: this call adds to it), and then to
        :meth:`put_columns`, which encodes no row twice. TypeError for
        columns that are not such lists.

        *topic_bytes* and *file_size*: as for :meth:`check_all` (rows of an
        unbound queue checked against ``topic_bytes(topic)``, asked once per
        call for a str topic, and a CommitLog file of *file_size* bytes
        where none is bound); put_columns writes such rows once their queue
        is bound."""
        _check_columns(bodies, queue_ids, tags, keys, unique_keys)
        if (topic_bytes is None) != (file_size is None):
            raise TypeError("topic_bytes and file_size go together")
        enc = _encoded(encoded)
        if enc is None or not _for_columns(enc, topic, bodies):
            enc = _Encoded(bodies, [None] * len(bodies), topic)
        unbound: dict | None = None
        if topic_bytes is not None:
            unbound = {topic: _placeholder_of(topic_bytes(topic) if type(topic) is str else None)}
        size = 0 if file_size is None else operator.index(file_size)
        i = operator.index(start)
        while i < len(bodies):
            m = self._row(topic, bodies, queue_ids, tags, keys, unique_keys, i)
            e = None if m is None else self._checked(m, unbound, size)
            if e is None:
                break
            if enc.encodings[i] is None:
                enc.encodings[i] = e
            i += 1
        return i, enc

    @_one_call_at_a_time
    def put_columns(self, topic, bodies, queue_ids, tags, keys, unique_keys, start, store_timestamp,
                    physical_offsets, sizes, queue_offsets, encoded=None) -> int:
        """:meth:`put` of rows ``start..`` of columns (see :meth:`check_columns`),
        all with *store_timestamp* (RocketMQ stamps a batch once), each
        result's physical offset, size and queue offset stored at its row of
        the three int64 arrays; stops at the first row ``put`` declines and
        returns its index (len(bodies) when none). ValueError for output
        arrays shorter than the columns. *encoded*: check_columns' for these
        columns (rows it kept are written as encoded then, while their queue
        is bound as it was), or None."""
        _check_columns(bodies, queue_ids, tags, keys, unique_keys)
        enc = _encoded(encoded)
        if enc is not None and not _for_columns(enc, topic, bodies):
            enc = None
        n = len(bodies)
        outs = [memoryview(a).cast("B") for a in (physical_offsets, sizes, queue_offsets)]
        if any(len(o) < n * 8 for o in outs):
            raise ValueError("the output arrays must hold len(bodies) int64 values")
        po, so, oo = (o.cast("q") for o in outs)
        i = operator.index(start)
        while i < n:
            e = None if enc is None else self._bound(enc.encodings[i])
            if e is None:
                m = self._row(topic, bodies, queue_ids, tags, keys, unique_keys, i)
                e = None if m is None else self._encode(m)
            r = None if e is None else self._write(e, store_timestamp)
            if r is None:
                break
            po[i], so[i], oo[i] = r[2], r[3], r[4]
            i += 1
        return i


class AppendLock:
    """The store's append lock (RocketMQ's ``PutMessageReentrantLock``):
    reentrant, with ``acquire(blocking=True)``, ``release()`` and the
    context manager protocol; ``release`` by a thread that does not hold it
    raises RuntimeError. The twin wraps ``threading.RLock``. The core's is
    its own, so that its ``PutGate`` takes it in C (``RLock.acquire`` parses
    its arguments on every call); a thread waiting for it releases the GIL
    and runs signal handlers, as ``RLock`` waiters do."""

    __slots__ = ("_lock",)

    def __init__(self) -> None:
        self._lock = threading.RLock()

    def acquire(self, blocking=True) -> bool:
        return self._lock.acquire(blocking)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self._lock.acquire()

    def __exit__(self, *exc) -> None:
        self._lock.release()


def _wall_ms() -> int:
    return time.time_ns() // 1_000_000


def _check_columns(bodies, queue_ids, tags, keys, unique_keys) -> None:
    n = len(bodies)
    if type(bodies) is not list or type(queue_ids) is not list or len(queue_ids) != n:
        raise TypeError("bodies and queue_ids must be lists of one length")
    for col in (tags, keys, unique_keys):
        if col is not None and (type(col) is not list or len(col) != n):
            raise TypeError("tags, keys and unique_keys must be None or lists as long as bodies")
