"""RocketMQ's dispatch rules, written once for the Python layers (docs/recovery.md#dispatch).

What a CommitLog record adds to the other files when it is dispatched
(RocketMQ ``CommitLogDispatcherBuildConsumeQueue`` and
``CommitLogDispatcherBuildIndex``):

- which records get a ConsumeQueue unit: :func:`gets_consume_queue_unit`
  (:func:`consume_queue_mask` for a column of sysflags);
- the unit's tags code, with the delay rule of ``SCHEDULE_TOPIC_XXXX``:
  :func:`tags_code` (:func:`tags_hash` without the delay rule);
- which records are indexed, and under which keys: :func:`gets_index_entries`
  (:func:`index_mask`) and :func:`index_keys` (:func:`index_key_rows` for
  Arrow batches).

The store, the tools (verify, salvage), the Spark rebuild and the columns
path call these. Each rule is written once per implementation, in the
kernels (the Cython core and its pure-Python twin, whose put path applies
them): the functions here call ``gets_consume_queue_unit``,
``gets_index_entries``, ``delay_level`` and ``java_hash`` of the chosen
kernels. The numpy forms (:func:`consume_queue_mask`, :func:`index_mask`,
:func:`index_key_rows`) restate the first two rules for whole columns;
``tests/test_dispatch.py`` checks that they agree with the kernels.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING

from . import _kernels as k
from .format.layout import (
    KEY_SEPARATOR,
    PROPERTY_DELAY,
    PROPERTY_TAGS,
    SCHEDULE_TOPIC,
    TRANSACTION_COMMIT_TYPE,
    TRANSACTION_MASK,
    TRANSACTION_NOT_TYPE,
    TRANSACTION_ROLLBACK_TYPE,
)

if TYPE_CHECKING:
    import numpy as np

__all__ = [
    "consume_queue_mask", "gets_consume_queue_unit", "gets_index_entries", "index_key_rows", "index_keys", "index_mask",
    "java_parse_int", "tags_code", "tags_hash",
]

log = logging.getLogger("rmqstore.dispatch")


def gets_consume_queue_unit(sys_flag: int) -> bool:
    """Whether a record with SYSFLAG *sys_flag* (an int; only the transaction
    bits 2-3 count, docs/format.md#sysflag-bits) gets a ConsumeQueue unit:
    True for "not a transaction" (0x0) and "commit" (0x8), False for
    "prepared" (0x4) and "rollback" (0xC). RocketMQ
    ``CommitLogDispatcherBuildConsumeQueue.dispatch`` (``MessageSysFlag.getTransactionValue``)."""
    return k.gets_consume_queue_unit(sys_flag)


def gets_index_entries(sys_flag: int) -> bool:
    """Whether a record with SYSFLAG *sys_flag* (an int) is indexed under its
    keys (docs/format.md#building-the-index): every transaction type but
    rollback (0xC), prepared records included. RocketMQ
    ``IndexService.buildIndex``. Whether the store's index is enabled at all
    (``message_index_enable``) is the caller's question."""
    return k.gets_index_entries(sys_flag)


def consume_queue_mask(sys_flags: np.ndarray) -> np.ndarray:
    """:func:`gets_consume_queue_unit` of each element of the integer array
    *sys_flags*: a bool array of the same shape."""
    tran = sys_flags & TRANSACTION_MASK
    return (tran == TRANSACTION_NOT_TYPE) | (tran == TRANSACTION_COMMIT_TYPE)


def index_mask(sys_flags: np.ndarray) -> np.ndarray:
    """:func:`gets_index_entries` of each element of the integer array
    *sys_flags*: a bool array of the same shape."""
    return (sys_flags & TRANSACTION_MASK) != TRANSACTION_ROLLBACK_TYPE


def tags_hash(tags: str | None) -> int:
    """The tags code without the delay rule (docs/format.md#tags-code): Java's
    ``String.hashCode`` of *tags* (a str; UTF-16 code units) as a signed
    i32, or 0 for None or "". RocketMQ ``MessageExtBrokerInner.tagsString2tagsCode``."""
    return k.java_hash(tags) if tags else 0


def tags_code(topic: str, props: dict, store_timestamp: int, config) -> int:
    """The tags code of a record's ConsumeQueue unit (docs/format.md#tags-code).

    Args:
        topic (str): the record's topic.
        props (dict): its properties (str to str), as ``parse_properties`` reads them.
        store_timestamp (int): its STORETIMESTAMP, ms since the epoch.
        config: a ``StoreConfig`` (``max_delay_level``, ``delay_millis``).

    Returns:
        int: :func:`tags_hash` of the TAGS property; for ``SCHEDULE_TOPIC_XXXX``
        with a DELAY level > 0 the delivery time in ms instead, store time +
        the level's delay (the level capped at the highest,
        docs/format.md#delay-rule). A DELAY Java's ``Integer.parseInt``
        rejects keeps the tags hash with a warning, never an error
        (docs/recovery.md#pitfall-bad-record-in-dispatch). RocketMQ
        ``CommitLog.checkMessageAndReturnSize``.
    """
    tags = props.get(PROPERTY_TAGS)
    code = k.java_hash(tags) if tags else 0
    if topic == SCHEDULE_TOPIC:
        delay = props.get(PROPERTY_DELAY)
        if delay:
            level = k.delay_level(delay, config.max_delay_level)
            if level < 0:
                log.warning("record in %s has a non-numeric DELAY %r; tags code kept", topic, delay)
            elif level > 0:
                code = store_timestamp + config.delay_millis(level)
    return code


def java_parse_int(text: str) -> int | None:
    """Java ``Integer.parseInt``: optional sign, ASCII digits, i32 range; else None."""
    body = text[1:] if text[:1] in "+-" else text
    if not body or not body.isascii() or not body.isdigit():
        return None
    v = int(text)
    return v if -(1 << 31) <= v < (1 << 31) else None


def index_keys(uniq_key: str | None, keys: str | None) -> list:
    """The keys a record is indexed under, in order (docs/format.md#building-the-index):
    its UNIQ_KEY (*uniq_key*), then each non-empty space-separated piece of
    its KEYS (*keys*); both str or None. Each is stored as ``topic#key``
    (docs/format.md#key-hash). RocketMQ ``IndexService.buildIndex``."""
    todo = [uniq_key] if uniq_key else []
    if keys:
        todo += [key for key in keys.split(KEY_SEPARATOR) if key]
    return todo


def index_key_rows(topics, unique_keys, keys) -> tuple:
    """:func:`index_keys` of a batch of records, vectorized for Arrow.

    Args:
        topics, unique_keys, keys: pyarrow string arrays of equal length,
            one row per record (TOPIC, UNIQ_KEY, KEYS; nulls allowed in the last two).

    Returns:
        tuple: ``(owner, full)``: an int64 ndarray, the row each index entry
        belongs to, and a pyarrow string array of its ``topic#key``; in row
        order and, within a row, the order :func:`index_keys` gives.
    """
    import numpy as np
    import pyarrow as pa
    import pyarrow.compute as pc

    # UNIQ_KEY entries: position 0 of their record
    has_uniq = pc.fill_null(pc.greater(pc.binary_length(unique_keys), 0), False).to_numpy(zero_copy_only=False)
    u_owner = np.flatnonzero(has_uniq)
    u_keys = unique_keys.filter(pa.array(has_uniq))
    # KEYS entries: positions 1.. in the order written
    lists = pc.split_pattern(keys, KEY_SEPARATOR)
    flat = pc.list_flatten(lists)
    k_owner = pc.list_parent_indices(lists).to_numpy().astype(np.int64)
    offsets = lists.offsets.to_numpy().astype(np.int64)
    k_pos = np.arange(len(flat), dtype=np.int64) - offsets[k_owner] + 1
    nonempty = pc.greater(pc.binary_length(flat), 0).to_numpy(zero_copy_only=False)
    owner = np.concatenate([u_owner, k_owner[nonempty]])
    pos = np.concatenate([np.zeros(u_owner.size, np.int64), k_pos[nonempty]])
    found = pa.concat_arrays([u_keys, flat.filter(pa.array(nonempty))])
    order = np.lexsort((pos, owner))
    owner = owner[order]
    full = pc.binary_join_element_wise(topics.take(pa.array(owner)), found.take(pa.array(order)), "#")
    return owner, full
