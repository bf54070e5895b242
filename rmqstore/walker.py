"""Moved to :mod:`rmqstore.storage.walker`; this module re-exports its names for old imports."""

from .storage.walker import (
    PHY_MISMATCH,
    Segment,
    data_ranges,
    find_valid_record,
    iter_records,
    list_segments,
    map_readonly,
    validate_record,
)
from .storage.walker import prop_crc as prop_crc

__all__ = [
    "PHY_MISMATCH", "Segment", "data_ranges", "find_valid_record", "iter_records", "list_segments", "map_readonly",
    "validate_record",
]
