"""Moved to :mod:`rmqstore.format.ids`; this module re-exports its names for old imports."""

from .format.ids import _split_offset_msg_id as _split_offset_msg_id
from .format.ids import decode_host, decode_offset_msg_id, encode_host, new_unique_key, offset_msg_id

__all__ = ["encode_host", "decode_host", "offset_msg_id", "decode_offset_msg_id", "new_unique_key"]
