"""The on-disk format, in Python: ``layout`` holds every constant of RocketMQ's
store files (record fields, magic codes, ConsumeQueue unit, index header, slot
and entry sizes, flags, property names; docs/format.md), ``ids`` the host
encoding, offset msgIds and UNIQ_KEYs (docs/format.md#message-ids). The
compiled core declares the same constants (tests/test_kernels.py checks them);
the record codec itself is a kernel (``rmqstore/_core_units/codec.pxi`` and
``rmqstore/_pure/codec.py``) and the dispatch rules are in
``rmqstore/dispatch.py``.
"""
