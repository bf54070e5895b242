"""The store's gates: ``PutGate`` (``put_message`` in one call) and
``ReadGate`` (the common case of its lookups and pulls in one call each),
which hand anything else to the store's careful paths."""

from __future__ import annotations

import operator
import weakref

from .appender import _wall_ms
from .reads import pull_messages, pull_views, query_keyed, time_lookup
from .state import StoreState


class PutGate:
    """``MessageStore.put_message`` in one call: the store's state checks,
    its append lock, the store clock, :meth:`Appender.put` and the store's
    bookkeeping after it; under SYNC_FLUSH (an Appender that does not
    dispatch) then ``store._commit``, with the lock released, so that
    producers share a sync (group commit). The store's ``put_message``
    (:class:`StoreCore`'s) calls it (the core's then runs no Python code on
    a put). What the gate reads and writes is the store's :class:`StoreState`
    *state* (``disk_full``, ``closed``, ``pending``, ``write_error``,
    ``waiting``; ``written_end``, ``last_store_ts``, ``last_logics_ts``),
    under the store's append *lock*; what it declines goes to
    ``store._put_one``, the step-by-step path.

    *clock*: None for the store's default, ``time.time_ns() // 1_000_000``
    (ms since the epoch, read in C by the core), else a callable returning
    the store time in ms. The gate keeps a weak reference to the store
    (its ``_put_gate`` field holds the gate); ``detach()`` (on close)
    drops the Appender and all it holds of the store, so that a gate kept
    past close keeps nothing alive and goes to ``_put_one``, which raises
    StoreClosedError (as the gate does once the store is gone)."""

    def __init__(self, store, state, lock, appender, clock) -> None:
        if type(state) is not StoreState:
            raise TypeError("state must be a StoreState")
        self._store = weakref.ref(store)
        self._state = state
        self._lock = lock
        self._appender = appender
        self._clock = _wall_ms if clock is None else clock

    def detach(self) -> None:
        self._appender = self._lock = None

    def put(self, msg):
        """``MessageStore.put_message(msg)``: the :class:`PutMessageResult`;
        raises what the step-by-step path raises."""
        fast, lock = self._appender, self._lock  # at once: detach may clear them
        store = self._store()
        if store is None:  # only a kept bound method outlives its store, which closed as it went
            from ..exceptions import StoreClosedError

            raise StoreClosedError("the store of this put_message is gone (closed)")
        st = self._state
        result = None
        if fast is not None and not st.disk_full:
            now = fast.dispatch  # (else SYNC_FLUSH: records wait in pending for the sync)
            with lock:
                if not st.closed and (not now or not st.pending) and st.write_error is None:
                    store_ts = self._clock()
                    result = fast.put(msg, store_ts)
                    if result is None:  # not for the one-call path: step by step
                        if now:
                            return store._put_one(msg, store_ts)
                        result = store._put_one(msg, store_ts, False)
                    else:
                        st.written_end = result[2] + result[3]
                        st.last_store_ts = store_ts
                        if fast.unit_timestamp >= 0:  # (a transaction's prepared record gets no unit)
                            st.last_logics_ts = fast.unit_timestamp
                        if st.waiting:  # read after the unit is in: a waiter that missed it sees it
                            store._wake_waiters()
                    if now:
                        return result
            if result is not None:  # SYNC_FLUSH: on disk, then dispatched (the lock released: group commit)
                store._commit(result[2] + result[3])
                return result
        return store._put_one(msg)


class ReadGate:
    """The common case of the store's lookups and pulls in one call each:
    ``get_offset_in_queue_by_time``, ``query_messages``, ``get_messages``
    and ``get_message_views`` (same names, arguments and defaults as the
    ``MessageStore`` methods,
    whose docstrings hold). The store's methods of those names
    (:class:`StoreCore`'s) call them, so the core's runs no Python code on
    an open store's lookup or pull. Each method:

    - checks the store is open (its :class:`StoreState`) and the gate attached;
    - for the common case (an exact ``"lower"``/``"upper"`` boundary; str
      topic and key; an int queue id, an int offset, timestamp, begin and
      end within a long, an int count in 1 .. 2**31-1, begin <= end, an int
      wait_ms in 0 .. 2**63-1, tags None or a str; views of a writable
      store) calls the whole-operation kernel (:func:`time_lookup`,
      :func:`query_keyed`, :func:`pull_messages`, :func:`pull_views`) with
      the store's reader references;
    - hands anything else to the store's careful path (``_`` + its name), which
      decides (errors, an argument out of its range, an unknown queue, a
      clean-up holding the references, a careful read, a follow or a wait
      included): a pull only when ``get_messages`` would return its result
      unchanged.

    Args:
        store (MessageStore): held weakly (the store holds the gate).
        state (StoreState): the store's.
        cqs (dict): the store's ConsumeQueues by (topic, queue_id).
        commitlog (CommitLogBase), index (IndexServiceBase), refs
            (ReferenceResource), read_only (bool): the store's.
        state (StoreState): the store's state (``closed`` is read per call).
        message_type (type): what a message is made as (``MessageExt``).
        result_type (type): ``GetMessageResult``, a 5-tuple type.
        views_type (type): ``GetViewsResult``, a 6-tuple type.
        units_of (Callable[[bytes], numpy.ndarray]): pull_views' packed
            units as ``GetViewsResult.units``.
        tag_filter (Callable): ``store._tag_filter``: a ``tags`` argument
            as the filter :func:`pull_messages` takes (None for every
            message); the gate keeps the last str's.
        min_units (int): a pull visits at least this many units
            (``store._MAX_FILTER_UNITS``).

    ``detach()`` (on close) drops what the gate holds of the store; the
    methods then go to the store's, which raise StoreClosedError, as they
    do once the store is gone."""

    def __init__(self, store, state, cqs, commitlog, index, refs, read_only, message_type, result_type, views_type,
                 units_of, tag_filter, min_units) -> None:
        if type(cqs) is not dict:
            raise TypeError("a store's _cqs must be a dict")
        if type(state) is not StoreState:
            raise TypeError("state must be a StoreState")
        self._state = state
        self._store_ref = weakref.ref(store)
        self._cqs: dict | None = cqs
        self._commitlog, self._index, self._refs = commitlog, index, refs
        self._read_only = bool(read_only)
        self._message_type, self._result_type = message_type, result_type
        self._views_type, self._units_of, self._tag_filter = views_type, units_of, tag_filter
        self._last_filter: tuple = (None, None)
        self._min_units = operator.index(min_units)

    def detach(self) -> None:
        self._cqs = self._commitlog = self._index = self._refs = None

    def _store(self):
        store = self._store_ref()
        if store is None:  # only a kept bound method outlives its store, which closed as it went
            from ..exceptions import StoreClosedError

            raise StoreClosedError("the store of this method is gone (closed)")
        return store

    def get_offset_in_queue_by_time(self, topic, queue_id, timestamp, boundary="lower"):
        cqs, commitlog, refs = self._cqs, self._commitlog, self._refs  # at once: detach may clear them
        store = self._store()
        upper = _BOUNDARY.get(boundary) if type(boundary) is str else None
        if upper is not None and cqs is not None and type(queue_id) is int and type(timestamp) is int \
                and _I64_MIN <= timestamp <= _I64_MAX and not self._state.closed:
            cq = cqs.get((topic, queue_id))
            if cq is not None:
                found = time_lookup(cq, commitlog, timestamp, upper, refs)
                if found is not None:
                    return found
        return store._get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)

    def query_messages(self, topic, key, max_count=64, begin=0, end=(1 << 63) - 1):
        cqs, index, commitlog, refs = self._cqs, self._index, self._commitlog, self._refs
        store = self._store()
        if cqs is not None and type(topic) is str and type(key) is str and type(max_count) is int \
                and 0 < max_count <= _I32_MAX and type(begin) is int and type(end) is int \
                and _I64_MIN <= begin <= end <= _I64_MAX and not self._state.closed:
            out: list = []
            if query_keyed(index, commitlog, topic, key, max_count, begin, end, self._message_type, out,
                           refs) is not None:
                return out
        return store._query_messages(topic, key, max_count, begin, end)

    def _filter(self, tags):
        last = self._last_filter  # (one tuple: another thread may replace it)
        if type(tags) is not str:
            return False
        if last[0] is tags:
            return last[1]
        try:
            found = self._tag_filter(tags)
        except Exception:
            return False
        self._last_filter = (tags, found)
        return found

    def get_messages(self, topic, queue_id, offset, max_count=32, tags=None, wait_ms=0):
        cqs, commitlog, refs = self._cqs, self._commitlog, self._refs
        store = self._store()
        wanted = None if tags is None else self._filter(tags)
        if cqs is not None and wanted is not False and _pull_args_ok(queue_id, offset, max_count) \
                and type(wait_ms) is int and 0 <= wait_ms <= _I64_MAX and not self._state.closed:
            cq = cqs.get((topic, queue_id))
            if cq is not None:
                out: list = []
                found = pull_messages(cq, commitlog, offset, max_count, max(max_count, self._min_units),
                                      self._message_type, out, wanted, refs)
                # what the store's method would do next: a careful read, a follow or a wait
                if found is not None and found[0] is not None and \
                        (out or (not self._read_only and wait_ms == 0)):
                    return tuple.__new__(self._result_type, (found[0], out, *found[1:]))
        return store._get_messages(topic, queue_id, offset, max_count, tags, wait_ms)

    def get_message_views(self, topic, queue_id, offset, max_count=32):
        cqs, commitlog, refs = self._cqs, self._commitlog, self._refs
        store = self._store()
        if cqs is not None and not self._read_only and _pull_args_ok(queue_id, offset, max_count) \
                and not self._state.closed:
            cq = cqs.get((topic, queue_id))
            if cq is not None:
                refs.hold()  # until the view exports the segment: then the store's close cannot unmap it
                try:
                    status, nxt, mn, mx, segment, packed = pull_views(cq, commitlog, offset, max_count,
                                                                      max(max_count, self._min_units), None)
                    view = None if segment is None else memoryview(segment).toreadonly()
                finally:
                    refs.release()
                if status is not None:  # (stopped: the store's method reads it carefully)
                    return tuple.__new__(self._views_type, (status, view, self._units_of(packed),
                                                            nxt, mn, mx))
        return store._get_message_views(topic, queue_id, offset, max_count)


_BOUNDARY = {"lower": False, "upper": True}
_I32_MAX = (1 << 31) - 1
_I64_MIN, _I64_MAX = -(1 << 63), (1 << 63) - 1


def _pull_args_ok(queue_id, offset, max_count) -> bool:
    """Whether a pull's numbers are exact ints within their ranges (else
    the store's method checks them, and raises)."""
    return type(queue_id) is int and type(offset) is int and type(max_count) is int \
        and _I64_MIN <= offset <= _I64_MAX and 0 < max_count <= _I32_MAX
