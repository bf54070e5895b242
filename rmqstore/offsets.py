"""Moved to :mod:`rmqstore.service.offsets`; this module re-exports its names for old imports."""

from .service.offsets import (
    CONSUMER_OFFSET_FILE,
    FLUSH_CONSUMER_OFFSET_INTERVAL_MS,
    TOPIC_GROUP_SEPARATOR,
    ConsumerOffsetStore,
    offset_key,
    parse_offset_json,
    split_offset_key,
)
from .service.offsets import _check_name as _check_name
from .service.offsets import _check_queue_id as _check_queue_id
from .service.offsets import _read_offset_file as _read_offset_file
from .service.offsets import encode_offset_json as encode_offset_json

__all__ = [
    "CONSUMER_OFFSET_FILE", "FLUSH_CONSUMER_OFFSET_INTERVAL_MS", "TOPIC_GROUP_SEPARATOR", "ConsumerOffsetStore",
    "offset_key", "parse_offset_json", "split_offset_key",
]
