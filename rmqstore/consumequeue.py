"""Moved to :mod:`rmqstore.storage.consumequeue`; this module re-exports its names for old imports."""

from .storage.consumequeue import ConsumeQueue, is_pre_blank, queue_dirs, tags_code
from .storage.consumequeue import java_parse_int as java_parse_int

__all__ = ["ConsumeQueue", "is_pre_blank", "queue_dirs", "tags_code"]
