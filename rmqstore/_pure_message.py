"""Moved to :mod:`rmqstore._pure.message` (the twin package); this module re-exports its names for old imports."""

from ._pure.message import _INT64 as _INT64
from ._pure.message import MESSAGE_FIELDS as MESSAGE_FIELDS
from ._pure.message import Message, MessageExt
from ._pure.message import _check_int as _check_int
from ._pure.message import encode_properties as encode_properties
from ._pure.message import ext_to_dict as ext_to_dict
from ._pure.message import message_fields as message_fields
from ._pure.message import offset_msg_id as offset_msg_id
from ._pure.message import property_map as property_map

__all__ = ["Message", "MessageExt"]
