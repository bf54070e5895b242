"""The dispatch rules of the put path, as the core's ``put_path.pxi`` has
them (docs/recovery.md#dispatch): which records get a ConsumeQueue unit,
which are indexed, and the DELAY level behind the tags code of
``SCHEDULE_TOPIC_XXXX``. ``rmqstore.dispatch`` calls these (through the
chosen kernels) for the Python layers."""

from __future__ import annotations

import operator

from ..format.layout import TRANSACTION_COMMIT_TYPE, TRANSACTION_MASK, TRANSACTION_NOT_TYPE, TRANSACTION_ROLLBACK_TYPE


def gets_consume_queue_unit(sys_flag: int) -> bool:
    """Whether a record with SYSFLAG *sys_flag* (an int) gets a ConsumeQueue
    unit (docs/recovery.md#dispatch): its transaction type (bits 2-3) is
    "not a transaction" or "commit"; prepared and rollback records get none.
    RocketMQ ``CommitLogDispatcherBuildConsumeQueue``. Raises TypeError
    unless *sys_flag* is an int."""
    tran = operator.index(sys_flag) & TRANSACTION_MASK
    return tran == TRANSACTION_NOT_TYPE or tran == TRANSACTION_COMMIT_TYPE


def gets_index_entries(sys_flag: int) -> bool:
    """Whether a record with SYSFLAG *sys_flag* (an int) is indexed under
    its keys: every transaction type but rollback, prepared records
    included (RocketMQ ``IndexService.buildIndex``). TypeError unless an int."""
    return operator.index(sys_flag) & TRANSACTION_MASK != TRANSACTION_ROLLBACK_TYPE


def delay_level(text: str, max_level: int) -> int:
    """The delay level a DELAY property *text* (a str) gives a unit of
    ``SCHEDULE_TOPIC_XXXX``: Java's ``Integer.parseInt`` of it, capped at
    *max_level* (an int >= 0, the number of levels); 0 for none (empty, or
    not above 0); -1 where parseInt fails (RocketMQ
    ``CommitLog.checkMessageAndReturnSize``). TypeError unless a str."""
    m = operator.index(max_level)
    if not isinstance(text, str):
        raise TypeError(f"DELAY must be a str, got {type(text).__name__}")
    if m < 0:
        raise ValueError("max_level must be >= 0")
    if not text:
        return 0
    digits = text[1:] if text[0] in "+-" else text
    if not digits or not all("0" <= c <= "9" for c in digits):
        return -1
    v = int(text)
    if not -(1 << 31) <= v < (1 << 31):
        return -1
    return max(0, min(v, m))
