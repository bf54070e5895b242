"""Hosts and message ids: the raw host fields of a record, the offset msgId
and the client's UNIQ_KEY (RocketMQ ``MessageDecoder``, ``MessageClientIDSetter``).

Shared by both implementations of ``Message``/``MessageExt`` and by the store;
re-exported by :mod:`rmqstore.message`.
"""

from __future__ import annotations

import functools
import ipaddress
import os
import random
import socket
import struct
import threading
import time

from ..exceptions import IllegalMessageError, MessageTypeError

__all__ = ["encode_host", "decode_host", "offset_msg_id", "decode_offset_msg_id", "new_unique_key"]

_INT32 = (-(1 << 31), (1 << 31) - 1)


@functools.lru_cache(maxsize=1024)
def encode_host(host) -> bytes:
    """Raw host field for ``"a.b.c.d:port"``, ``"[v6]:port"`` or ``(address, port)``:
    address bytes (4 or 16) + big-endian i32 port. Raises IllegalMessageError."""
    if isinstance(host, tuple) and len(host) == 2:
        addr, port = host
    elif isinstance(host, str):
        if host.startswith("["):
            addr, sep, port = host[1:].partition("]:")
        else:
            addr, sep, port = host.rpartition(":")
        if not sep:
            raise IllegalMessageError(f"host {host!r} is not 'address:port'")
    else:
        raise MessageTypeError(f"host must be 'address:port' or (address, port), got {type(host).__name__}")
    try:
        ip = ipaddress.ip_address(str(addr).split("%", 1)[0])
        port = int(port)
    except ValueError:
        raise IllegalMessageError(f"bad host {host!r}") from None
    if not _INT32[0] <= port <= _INT32[1]:
        raise IllegalMessageError(f"bad port in host {host!r}")
    return ip.packed + struct.pack(">i", port)


@functools.lru_cache(maxsize=1024)
def decode_host(raw: bytes) -> str:
    """``"a.b.c.d:port"`` or, for IPv6, Java's uncompressed ``"[2001:db8:0:0:0:0:0:7]:port"``."""
    port = struct.unpack(">i", raw[-4:])[0]
    addr = raw[:-4]
    if len(addr) == 4:
        return f"{addr[0]}.{addr[1]}.{addr[2]}.{addr[3]}:{port}"
    groups = struct.unpack(">8H", addr)
    return "[" + ":".join(f"{g:x}" for g in groups) + f"]:{port}"


def offset_msg_id(store_host_raw: bytes, physical_offset: int) -> str:
    """Offset message id (docs/format.md#offset-msgid): store host address + port + physical offset, upper-case hex."""
    return (store_host_raw + struct.pack(">q", physical_offset)).hex().upper()


def _split_offset_msg_id(msg_id) -> tuple:
    """``(raw store host, physical_offset)`` of an offset message id: 32 or
    56 hex digits in either case, nothing else. Raises ValueError."""
    if not isinstance(msg_id, str) or len(msg_id) not in (32, 56):
        raise ValueError(f"not an offset message id: {msg_id!r}")
    raw = bytes.fromhex(msg_id)
    if len(raw) * 2 != len(msg_id):  # (fromhex skips whitespace)
        raise ValueError(f"not an offset message id: {msg_id!r}")
    return raw[:-8], int.from_bytes(raw[-8:], "big", signed=True)


def decode_offset_msg_id(msg_id: str) -> tuple:
    """``(store_host, physical_offset)`` of an offset message id; raises ValueError if malformed."""
    host_raw, offset = _split_offset_msg_id(msg_id)
    return decode_host(host_raw), offset


class _UniqueKeyFactory:
    """Client-compatible UNIQ_KEY generator (``MessageClientIDSetter``, docs/format.md#uniq_key)."""

    _pid: int  # set on first use, with _prefix

    def __init__(self):
        self._lock = threading.Lock()
        self._counter = 0
        self._prefix = None
        self._month_start = 0
        self._next_month = 0

    @staticmethod
    def _local_ip() -> bytes:
        try:
            infos = socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)
            for info in infos:
                ip = ipaddress.ip_address(info[4][0])
                if not ip.is_loopback:
                    return ip.packed
        except OSError:
            pass
        return struct.pack(">q", int(time.time() * 1000))[-4:]

    def _roll_month(self, now_ms: int) -> None:
        t = time.localtime(now_ms / 1000)
        start = time.mktime((t.tm_year, t.tm_mon, 1, 0, 0, 0, 0, 0, -1))
        year, month = (t.tm_year + 1, 1) if t.tm_mon == 12 else (t.tm_year, t.tm_mon + 1)
        nxt = time.mktime((year, month, 1, 0, 0, 0, 0, 0, -1))
        self._month_start, self._next_month = int(start * 1000), int(nxt * 1000)

    def __call__(self) -> str:
        now = int(time.time() * 1000)
        with self._lock:
            if self._prefix is None or os.getpid() != self._pid:
                self._pid = os.getpid()
                self._prefix = (
                    self._local_ip() + struct.pack(">H", self._pid & 0xFFFF) + random.getrandbits(32).to_bytes(4, "big")
                )
            if now >= self._next_month:
                self._roll_month(now)
            diff = (now - self._month_start) & 0xFFFFFFFF
            self._counter = (self._counter + 1) & 0xFFFF
            counter = self._counter
        return (self._prefix + struct.pack(">IH", diff, counter)).hex().upper()


new_unique_key = _UniqueKeyFactory()
new_unique_key.__doc__ = """A new client-compatible UNIQ_KEY (32 upper-case hex chars, docs/format.md#uniq_key):
local IPv4, pid, a per-process random value, ms since the start of the local
month, a counter. Thread-safe."""

