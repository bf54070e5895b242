"""Delayed delivery: RocketMQ's delay levels (docs/service.md#delayed-delivery).

A message put with a ``DELAY`` level above 0 (``Message(..., delay_level=N)``
or the property itself) is not stored in its topic: the put rewrites it as
RocketMQ's broker does (``HookUtils.transformDelayLevelMessage``; 4.x did it
in ``CommitLog.asyncPutMessage``), :func:`to_schedule`:

* the level is capped at the last of ``message_delay_level``;
* properties ``REAL_TOPIC`` and ``REAL_QID`` keep the topic and queue;
* the record goes to topic ``SCHEDULE_TOPIC_XXXX``, queue ``level - 1``, and
  its ConsumeQueue unit's tags code is its delivery time (store time + the
  level's delay, docs/format.md#delay-rule).

Only messages that are not transactional or are commits are delayed; a
message put into ``SCHEDULE_TOPIC_XXXX`` itself is stored as it is (it is
one a broker or an earlier put already rewrote).

The writer's :class:`ScheduleService` (RocketMQ's ``ScheduleMessageService``)
walks each level's queue in order and, once a record's delivery time has
come on the store's clock, puts it again as a new record of its real topic
and queue (:func:`time_up_message`: the same body, flag, hosts, born time and
properties, less ``DELAY``), then moves the level's offset past it. The
offsets are RocketMQ's ``config/delayOffset.json`` (:class:`DelayOffsetTable`),
written after every round that delivered and at close, so a broker that
takes the directory over goes on from there, and so does the next open.

Guarantees: a record is never delivered before its time (a clock that
stepped back by more than a level's delay delivers at once rather than
never, as RocketMQ does); nothing is lost across restarts or a crash: the
offset only passes a record once its delivery is stored; a crash after a
delivery and before the offsets were written delivers that record again
on the next open (at least once, RocketMQ's guarantee), a clean close
exactly once.
"""

from __future__ import annotations

import json
import logging
import os
import threading

from .. import _kernels as k
from ..exceptions import CorruptedFileError, IllegalMessageError, StoreClosedError
from ..format.layout import (
    PROPERTY_DELAY,
    PROPERTY_REAL_QUEUE_ID,
    PROPERTY_REAL_TOPIC,
    PROPERTY_TIMER_DELAY_SEC,
    PROPERTY_TIMER_DELIVER_MS,
    SCHEDULE_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
    TRANSACTION_NOT_TYPE,
)
from ..message import GetMessageStatus, Message
from .offsets import _INT32_MAX, _INT64_MAX, _as_int, encode_data_version, load_json_object, replace_config_file
from .retry import drain_send_backs

__all__ = ["DELAY_OFFSET_FILE", "DelayOffsetTable", "ScheduleService", "time_up_message", "to_schedule"]

log = logging.getLogger("rmqstore.schedule")

DELAY_OFFSET_FILE = os.path.join("config", "delayOffset.json")
#: the transactional half-message topic: a delayed record naming it as its
#: real topic is dropped, as RocketMQ drops it
TRANS_HALF_TOPIC = "RMQ_SYS_TRANS_HALF_TOPIC"
#: longest wait between two looks at the levels, s (a put of a delayed
#: message wakes the service at once; RocketMQ looks every 100 ms)
_LOOK = 1.0
#: records read from a level's queue at a time
_BATCH = 32


# --- the rules ---------------------------------------------------------------------------


def parse_delay(text: str) -> int:
    """The level of a DELAY property *text*: Java's ``Integer.parseInt`` of it
    (RocketMQ's ``getDelayTimeLevel``), 0 for a level of 0 or below.
    IllegalMessageError where parseInt would throw (an empty text too)."""
    level = k.delay_level(text, _INT32_MAX) if text else -1
    if level < 0:
        raise IllegalMessageError(f"DELAY {text!r} is not a decimal delay level")
    return level


def to_schedule(topic: str, queue_id: int, sys_flag: int, props: dict, max_level: int):
    """The delay rewrite of a message being put: ``(SCHEDULE_TOPIC_XXXX,
    level - 1)`` with *props* (the message's property dict, changed in
    place) given ``DELAY`` = the capped level, ``REAL_TOPIC`` = *topic* and
    ``REAL_QID`` = *queue_id*; None (nothing changed) when the message is
    not delayed: no DELAY, a level of 0 or below, a prepared or rollback
    record, a message already in ``SCHEDULE_TOPIC_XXXX``, or no levels.

    Raises IllegalMessageError for a DELAY that is not a decimal integer
    (RocketMQ refuses the send)."""
    text = props.get(PROPERTY_DELAY)
    if text is None or topic == SCHEDULE_TOPIC:
        return None
    if sys_flag & TRANSACTION_MASK not in (TRANSACTION_NOT_TYPE, TRANSACTION_COMMIT_TYPE):
        return None
    level = parse_delay(text)
    if level <= 0 or max_level <= 0:
        return None
    level = min(level, max_level)
    props[PROPERTY_DELAY] = str(level)
    props[PROPERTY_REAL_TOPIC] = topic
    props[PROPERTY_REAL_QUEUE_ID] = str(queue_id)
    return SCHEDULE_TOPIC, level - 1


def time_up_message(ext) -> Message:
    """The record a due delayed record *ext* (a :class:`MessageExt` of
    ``SCHEDULE_TOPIC_XXXX``) is delivered as (RocketMQ's
    ``ScheduleMessageService.messageTimeUp``): topic ``REAL_TOPIC``, queue
    ``REAL_QID``, its body, flag, sys flag, born time and hosts and reconsume
    times, its properties less ``DELAY`` (and the timer properties), in
    their order; ``REAL_TOPIC`` and ``REAL_QID`` stay.

    Raises ValueError when the record names no real topic or queue."""
    props = dict(ext.properties or {})
    for name in (PROPERTY_DELAY, PROPERTY_TIMER_DELIVER_MS, PROPERTY_TIMER_DELAY_SEC):
        props.pop(name, None)
    topic = props.get(PROPERTY_REAL_TOPIC)
    qid = props.get(PROPERTY_REAL_QUEUE_ID)
    if not topic:
        raise ValueError("no REAL_TOPIC")
    try:
        queue_id = _as_int(qid, "REAL_QID", 0, _INT32_MAX)
    except ValueError:
        raise ValueError(f"REAL_QID {qid!r} is not a queue id") from None
    return Message(
        topic, ext.body, queue_id=queue_id, flag=ext.flag, properties=props,
        born_timestamp=ext.born_timestamp, born_host=ext.born_host, store_host=ext.store_host,
        reconsume_times=ext.reconsume_times, sys_flag=ext.sys_flag,
    )


# --- config/delayOffset.json ---------------------------------------------------------------


class DelayOffsetTable:
    """RocketMQ's ``config/delayOffset.json`` (``DelayOffsetSerializeWrapper``):
    per delay level, the queue offset of ``SCHEDULE_TOPIC_XXXX`` queue
    ``level - 1`` to deliver next::

        {
            "dataVersion":{...},
            "offsetTable":{"1":17,"3":2
            }
        }

    (tab-indented).

    Read in fastjson's form too (bare integer keys), from ``.bak`` when the
    file is missing or does not parse; written atomically with the previous
    version kept as ``.bak`` (:func:`~rmqstore.service.offsets.replace_config_file`),
    levels as quoted keys (strict JSON, which fastjson reads). Other
    members are written back as read. One writer (the store's) writes it.
    """

    def __init__(self, path):
        self.path = os.fspath(path)
        self.table: dict = {}
        self._version = {"counter": 0, "stateVersion": 0, "timestamp": 0}
        self._extra: dict = {}
        self._main_good = False

    @staticmethod
    def parse(text: str) -> tuple:
        """``(table, dataVersion or None, other members)`` of a file's text.
        ValueError when it is not a delay offset table."""
        doc = load_json_object(text)
        raw = doc.get("offsetTable") or {}
        if not isinstance(raw, dict):
            raise ValueError("offsetTable is not an object")
        table = {}
        for level, off in raw.items():
            if off is not None:
                table[_as_int(level, "delay level", 1, _INT32_MAX)] = _as_int(off, "offset", 0, _INT64_MAX)
        version = doc.get("dataVersion")
        if version is not None and not isinstance(version, dict):
            raise ValueError("dataVersion is not an object")
        extra = {n: v for n, v in doc.items() if n not in ("offsetTable", "dataVersion")}
        return table, version, extra

    def load(self) -> None:
        """Read the file, or its ``.bak`` when it is missing or does not parse;
        neither: an empty table. CorruptedFileError when the file and its
        ``.bak`` exist and neither parses."""
        bad = None
        for candidate in (self.path, self.path + ".bak"):
            try:
                with open(candidate, "rb") as fh:
                    data = fh.read()
            except FileNotFoundError:
                continue
            if not data.strip():
                continue
            try:
                table, version, extra = self.parse(data.decode("utf-8"))
            except (ValueError, UnicodeDecodeError) as e:
                log.warning("%s does not parse (%s)", candidate, e)
                bad = bad or CorruptedFileError(f"not a delayOffset.json: {e}", candidate)
                continue
            self.table = table
            if version:
                self._version.update({n: int(v) for n, v in version.items() if isinstance(v, int)})
            self._extra = extra
            self._main_good = candidate == self.path
            return
        if bad is not None:
            raise bad

    def encode(self) -> str:
        """The file text (fastjson's pretty layout: tabs, members in order)."""
        members = {
            "dataVersion": encode_data_version(self._version),
            "offsetTable": (
                "{" + ",".join(f'"{level}":{off}' for level, off in sorted(self.table.items())) + "\n\t}"
                if self.table else "{}"
            ),
        }
        for name, value in self._extra.items():
            members.setdefault(name, json.dumps(value, ensure_ascii=False, separators=(",", ":")))
        return "{" + ",".join(f"\n\t{json.dumps(n, ensure_ascii=False)}:{members[n]}" for n in sorted(members)) \
            + "\n}"

    def persist(self, now_ms: int) -> None:
        """Write the table (the data version moves on, stamped *now_ms*).
        Raises OSError (the previous file is then intact)."""
        os.makedirs(os.path.dirname(self.path), exist_ok=True)
        self._version["counter"] = int(self._version["counter"]) + 1
        self._version["timestamp"] = now_ms
        replace_config_file(self.path, self.encode().encode("utf-8"), backup=self._main_good)
        self._main_good = True


# --- the service ----------------------------------------------------------------------------


class ScheduleService:
    """The writer's delivery of delayed messages (see the module docstring).

    :meth:`deliver_due` does one round; the service thread runs rounds
    whenever a level's next record is due (woken at once by a put of a
    delayed message, else looking at least every second) from the store's
    first delayed message on (at open, when it has some). Before that, its
    rounds only store what follower processes sent back
    (:func:`~rmqstore.service.retry.drain_send_backs`) and read no clock.
    The store starts and stops it."""

    def __init__(self, store):
        self._store = store
        self.offsets = DelayOffsetTable(os.path.join(store.root_dir, DELAY_OFFSET_FILE))
        self._lock = threading.Lock()  # (one round at a time)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._dirty = False
        self._armed = False  # delayed messages exist: rounds deliver (and read the clock)
        #: records delivered by this service since the store opened
        self.delivered = 0

    def load(self) -> None:
        """Read ``config/delayOffset.json`` (the store's open does, before it
        writes anything). CorruptedFileError (see :meth:`DelayOffsetTable.load`)."""
        self.offsets.load()

    def start(self) -> None:
        """Bring each level's offset into its queue's range (RocketMQ's
        ``correctDelayOffset``; the store's queues are recovered by now) and
        start the thread, delivering at once when anything is delayed."""
        store = self._store
        levels = self._levels()
        for level, qid in levels:
            off = self.offsets.table.get(level)
            if off is None:
                continue
            lo = store.get_min_offset_in_queue(SCHEDULE_TOPIC, qid)
            hi = store.get_max_offset_in_queue(SCHEDULE_TOPIC, qid)
            fixed = min(max(off, lo), hi)
            if fixed != off:
                log.error("delay level %d: offset %d outside queue [%d, %d]; moved to %d", level, off, lo, hi, fixed)
                self.offsets.table[level] = fixed
        self._armed = bool(levels)
        self._thread = threading.Thread(
            target=self._run, name=f"rmqstore-schedule:{os.path.basename(store.root_dir)}", daemon=True,
        )
        self._thread.start()

    def _levels(self) -> list:
        """``(level, queue id)`` of the delay queues the store has."""
        cqs = self._store._cqs  # (18 lookups, not a sorted list of every queue, per round)
        return [(q + 1, q) for q in range(self._store.config.max_delay_level) if (SCHEDULE_TOPIC, q) in cqs]

    def wake(self) -> None:
        """A delayed message was put: deliver from now on, a round now."""
        self._armed = True
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread (the round in progress ends first). Writes nothing:
        the store's close persists (:meth:`persist`), a crash does not."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()

    def persist(self) -> None:
        """Write the offsets if a round moved them since the last write."""
        with self._lock:
            if self._dirty:
                self.offsets.persist(self._store._clock())
                self._dirty = False

    def _run(self) -> None:
        store = self._store
        while not self._stop.is_set():
            self._wake.clear()
            try:
                if self._armed:
                    wait_ms = self.deliver_due()
                else:
                    with self._lock:
                        drain_send_backs(store)
                    wait_ms = None
            except StoreClosedError:
                return
            except Exception:  # (a disk error, say: RocketMQ tries again after 10 s)
                log.exception("delivering delayed messages of %s", store.root_dir)
                wait_ms = 10_000
            self._wake.wait(_LOOK if wait_ms is None else min(max(wait_ms, 1) / 1000, _LOOK))

    def deliver_due(self) -> int | None:
        """One round: store what followers sent back, then deliver, level by
        level and in queue order, every record whose time has come on the
        store's clock; then write the offsets if any moved. Returns ms until
        the earliest record not yet due (None: none waits). Raises
        StoreClosedError, and what a put raises (the record stays to be
        delivered by a later round)."""
        store = self._store
        cfg = store.config
        soonest = None
        with self._lock:
            drain_send_backs(store)
            try:
                for level, qid in self._levels():
                    due = self._deliver_level(store, cfg, level, qid)
                    if due is not None:
                        soonest = due if soonest is None else min(soonest, due)
            finally:
                if self._dirty:
                    self.offsets.persist(store._clock())
                    self._dirty = False
        return soonest

    def _deliver_level(self, store, cfg, level: int, qid: int):
        """Deliver what is due of one level; ms until its next record is due, or None."""
        table = self.offsets.table
        off = table.get(level, 0)
        delay = cfg.delay_millis(level)
        while True:
            r = store.get_messages(SCHEDULE_TOPIC, qid, off, _BATCH)
            if r.status is not GetMessageStatus.FOUND:
                nxt = r.next_begin_offset
                if nxt > off and r.status not in (GetMessageStatus.OFFSET_OVERFLOW_ONE,
                                                  GetMessageStatus.OFFSET_OVERFLOW_BADLY):
                    off = table[level] = nxt  # (units removed by clean-up, or not for delivery)
                    self._dirty = True
                    continue
                return None
            batch, last = [], off
            wait = None
            for ext in r.messages:
                now = store._clock()
                text = (ext.properties or {}).get(PROPERTY_DELAY, "")
                lvl = k.delay_level(text, cfg.max_delay_level) if text else 0
                due = ext.store_timestamp + cfg.delay_millis(lvl if lvl > 0 else level)
                if due > now + delay:  # the clock stepped back: deliver now, not in an age
                    due = now
                if due > now:
                    wait = due - now
                    break
                try:
                    msg = time_up_message(ext)
                except (ValueError, IllegalMessageError) as e:
                    log.error("delayed record at %d (level %d offset %d) cannot be delivered (%s); skipped",
                              ext.physical_offset, level, ext.queue_offset, e)
                    msg = None
                if msg is not None and msg.topic == TRANS_HALF_TOPIC:
                    log.error("delayed record at %d names the half-message topic; dropped", ext.physical_offset)
                    msg = None
                batch.append(msg)
                last = ext.queue_offset + 1
            msgs = [m for m in batch if m is not None]
            if msgs:
                store.put_messages(msgs)  # (all or nothing: on an error the offset stays)
                self.delivered += len(msgs)
            if last != off:
                off = table[level] = last
                self._dirty = True
            if wait is not None:
                return wait
            if r.next_begin_offset > off:  # (the batch's tail was not for delivery)
                off = table[level] = r.next_begin_offset
                self._dirty = True
