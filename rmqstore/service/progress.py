"""Consumer groups' progress (RocketMQ mqadmin's ``consumerProgress``): per
group, topic and queue, the committed offset against what the queue holds.
Shared by ``rmqstore consumer-progress`` and ``rmqstore report``."""

from __future__ import annotations

import time

from .offsets import split_offset_key
from .retry import dlq_topic, retry_topic

__all__ = ["consumer_progress"]


def consumer_progress(store, group: str | None = None, now_ms: int | None = None) -> list:
    """One row (a dict) per (group, topic, queue) with a committed offset in
    ``config/consumerOffset.json``, sorted by group and topic, then queue:

    ``group``, ``topic``, ``queue_id``; ``committed_offset`` and
    ``max_offset`` (queue offsets); ``lag`` (messages stored past the
    committed offset; what clean-up removed is not lag);
    ``first_unconsumed_store_time`` (ms since epoch of the first message not
    consumed, None when there is no lag or its unit is gone); ``lag_ms``
    (*now_ms*, default the wall clock, minus that time, 0 or more);
    ``retry_messages`` and ``dead_letters`` (the messages the store holds in
    the group's ``%RETRY%`` and ``%DLQ%`` topics, docs/service.md#retries-and-dead-letters,
    the same on each of the group's rows).

    *store* is an open :class:`~rmqstore.MessageStore` (read-only is fine);
    *group* keeps one group's rows. Raises CorruptedFileError when the
    offsets file does not parse."""
    now = int(time.time() * 1000) if now_ms is None else now_ms
    rows = []
    for key, qmap in sorted(store.consumer_offsets().table().items()):
        tg = split_offset_key(key)
        if tg is None or (group is not None and tg[1] != group):
            continue
        topic, g = tg
        for qid, committed in sorted(qmap.items()):
            mn, mx = store.get_min_offset_in_queue(topic, qid), store.get_max_offset_in_queue(topic, qid)
            nxt = max(committed, mn)  # (what clean-up removed is not lag)
            lag = max(0, mx - nxt)
            first = None
            if lag:
                cq = store.consume_queue(topic, qid)
                unit = cq.get_unit(nxt) if cq is not None else None
                first = store.commitlog.store_timestamp_at(unit[0], unit[1]) if unit else None
            rows.append({
                "group": g, "topic": topic, "queue_id": qid, "committed_offset": committed, "max_offset": mx,
                "lag": lag, "first_unconsumed_store_time": first,
                "lag_ms": max(0, now - first) if first else 0,
            })
    held: dict = {}  # messages the store holds per topic (retry and dead-letter topics)
    for topic, qid in store.queues():
        held[topic] = held.get(topic, 0) + store.get_max_offset_in_queue(topic, qid) \
            - store.get_min_offset_in_queue(topic, qid)
    for r in rows:  # (the group's, on each of its rows: the rows stay one shape)
        r["retry_messages"] = held.get(retry_topic(r["group"]), 0)
        r["dead_letters"] = held.get(dlq_topic(r["group"]), 0)
    return rows
