"""Store configuration: RocketMQ's ``MessageStoreConfig`` in snake_case.

Every field has RocketMQ's default but the four file sizes, which default
to sizes that fit an embedded store; :meth:`StoreConfig.broker_defaults`
has RocketMQ's (docs/format.md#sizes-and-defaults). Field names are the
snake_case of the Java names, so a broker ``.properties`` file or a dict
with the Java camelCase names loads directly.
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass, field, fields

from .exceptions import ConfigError
from .format.layout import (
    CQ_STORE_UNIT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
    MAX_TOPIC_LENGTH_V1,
    MIN_RECORD_SIZE,
)

__all__ = ["StoreConfig", "ASYNC_FLUSH", "SYNC_FLUSH", "NO_FLUSH"]

ASYNC_FLUSH = "ASYNC_FLUSH"
SYNC_FLUSH = "SYNC_FLUSH"
#: not one of RocketMQ's modes: the store syncs nothing but its files'
#: creation, for stores that can be written again (staging, caches, tests);
#: a killed process loses nothing, a power loss anything (docs/recovery.md#no_flush)
NO_FLUSH = "NO_FLUSH"

#: the default CommitLog segment: RocketMQ's largest record (a 4 MiB body
#: and 64 KiB of the rest) plus its end-of-file blank, in whole 64 KiB
SERVICE_COMMIT_LOG_SIZE = 4 * 1024 * 1024 + 128 * 1024
#: RocketMQ's MessageStoreConfig sizes (a broker's): StoreConfig.broker_defaults()
BROKER_SIZES = {
    "mapped_file_size_commit_log": 1024 * 1024 * 1024,
    "mapped_file_size_consume_queue": 300_000 * CQ_STORE_UNIT_SIZE,
    "max_hash_slot_num": 5_000_000,
    "max_index_num": 5_000_000 * 4,
}

DEFAULT_DELAY_LEVELS = "1s 5s 10s 30s 1m 2m 3m 4m 5m 6m 7m 8m 9m 10m 20m 30m 1h 2h"
_DELAY_UNITS = {"s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000}


def _camel_to_snake(name: str) -> str:
    # word boundaries before an upper-case letter that follows a lower-case one,
    # and inside an acronym before its last letter: checkCRCOnRecover -> check_crc_on_recover
    return re.sub(r"(?<=[a-z0-9])(?=[A-Z])|(?<=[A-Z])(?=[A-Z][a-z])", "_", name).lower()


@dataclass(frozen=True)
class StoreConfig:
    """RocketMQ ``MessageStoreConfig`` fields that rmqstore uses (docs/format.md#sizes-and-defaults).

    Sizes are bytes, intervals milliseconds, ``file_reserved_time`` hours.
    ``mapped_file_size_consume_queue`` is rounded up to a multiple of 20 as
    RocketMQ's getter does. Raises :class:`ConfigError` for invalid values.

    Defaults are RocketMQ's, but for the file sizes: a service's store, not
    a broker's (a 4.125 MiB CommitLog segment, which holds RocketMQ's
    largest message; 20,000 units per ConsumeQueue file; 20,000 hash slots
    and 80,000 entries per IndexFile, 1.68 MB), so a thousand small
    messages take about 11 MB of disk, not 1.5 GB. The store grows by
    files. RocketMQ's broker sizes (1 GiB, 6 MB, 420 MB index files):
    :meth:`broker_defaults`. A store's sizes are fixed when it is made;
    :meth:`MessageStore.open` without a config reads them from its files.
    """

    mapped_file_size_commit_log: int = SERVICE_COMMIT_LOG_SIZE
    mapped_file_size_consume_queue: int = 20_000 * CQ_STORE_UNIT_SIZE
    max_hash_slot_num: int = 20_000
    max_index_num: int = 20_000 * 4
    max_message_size: int = 1024 * 1024 * 4
    max_topic_length: int = 127
    auto_message_version_on_topic_len: bool = True
    enabled_append_prop_crc: bool = False
    force_verify_prop_crc: bool = False
    check_crc_on_recover: bool = True
    flush_disk_type: str = ASYNC_FLUSH
    flush_interval_commit_log: int = 500
    flush_commit_log_least_pages: int = 4
    flush_commit_log_thorough_interval: int = 10_000
    sync_flush_timeout: int = 5000
    flush_interval_consume_queue: int = 1000
    flush_consume_queue_least_pages: int = 2
    flush_consume_queue_thorough_interval: int = 60_000
    message_index_enable: bool = True
    message_index_safe: bool = False
    max_msgs_num_batch: int = 64
    default_query_max_num: int = 32
    message_delay_level: str = DEFAULT_DELAY_LEVELS
    file_reserved_time: int = 72
    delete_when: str = "04"
    disk_max_used_space_ratio: int = 75
    disk_space_warning_level_ratio: int = 90
    disk_space_clean_forcibly_ratio: int = 85
    clean_file_forcibly_enable: bool = True
    clean_resource_interval: int = 10_000
    delete_commit_log_files_interval: int = 100
    delete_consume_queue_files_interval: int = 100
    destroy_maped_file_interval_forcibly: int = 120_000
    redelete_hanged_file_interval: int = 120_000
    delete_file_batch_max: int = 10
    warm_maped_file_enable: bool = True
    flush_least_pages_when_warm_maped_file: int = 1024 // 4 * 16
    # rmqstore's own knob: a service thread makes the next files ahead
    # (docs/format.md#files-made-ahead; RocketMQ always does for its CommitLog)
    make_files_ahead: bool = True
    # rmqstore's own knobs for the clean-up service (docs/recovery.md#retention; no RocketMQ name)
    clean_service_enable: bool = True
    clean_resource_initial_delay: int = 60_000
    # rmqstore's own knob: the writer does a broker's part for delayed messages (docs/service.md#delayed-delivery):
    # rewrites their puts into SCHEDULE_TOPIC_XXXX and delivers them (ScheduleMessageService); off, it
    # stores every message as given, as RocketMQ's DefaultMessageStore does, and delivers nothing
    schedule_service_enable: bool = True
    disk_check_interval: int = 1000
    follow_poll_interval: int = 10
    max_transfer_count_on_message_in_memory: int = 32
    max_transfer_bytes_on_message_in_memory: int = 256 * 1024
    duplication_enable: bool = False
    _delay_table: tuple = field(default=(), init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        for f in fields(self):
            if not f.init:
                continue
            v = getattr(self, f.name)
            want: type = type(f.default)
            if want is bool:
                if not isinstance(v, bool):
                    raise ConfigError(f"{f.name} must be a bool, got {v!r}")
            elif want is int:
                lo, hi, _why = _INT_RANGES[f.name]
                if isinstance(v, bool) or not isinstance(v, int):
                    raise ConfigError(f"{f.name} must be an int in [{lo}, {hi}], got {v!r}")
                if not lo <= v <= hi:
                    raise ConfigError(f"{f.name} must be in [{lo}, {hi}] ({_why}), got {v}")
            elif not isinstance(v, want):
                raise ConfigError(f"{f.name} must be a {want.__name__}, got {v!r}")
        cq = self.mapped_file_size_consume_queue
        if cq % CQ_STORE_UNIT_SIZE:  # RocketMQ's getter: whole units (the range leaves room for it)
            object.__setattr__(
                self, "mapped_file_size_consume_queue", (cq // CQ_STORE_UNIT_SIZE + 1) * CQ_STORE_UNIT_SIZE
            )
        size = _index_size(self.max_hash_slot_num, self.max_index_num)
        if size > INT32_MAX:
            raise ConfigError(
                f"max_hash_slot_num and max_index_num make a {size}-byte index file; the format's int32 "
                f"positions allow 40 + 4 * max_hash_slot_num + 20 * max_index_num <= {INT32_MAX}"
            )
        if self.flush_disk_type not in (ASYNC_FLUSH, SYNC_FLUSH, NO_FLUSH):
            raise ConfigError(
                f"flush_disk_type must be ASYNC_FLUSH, SYNC_FLUSH or NO_FLUSH, got {self.flush_disk_type!r}")
        _parse_hours(self.delete_when)
        object.__setattr__(self, "_delay_table", _parse_delay_levels(self.message_delay_level))

    # --- derived values -----------------------------------------------------

    @property
    def max_delay_level(self) -> int:
        """Number of delay levels in ``message_delay_level``."""
        return len(self._delay_table)

    def delay_millis(self, level: int) -> int:
        """Delay in ms of delay *level* (1-based); 1000 for a level missing from the table."""
        if 1 <= level <= len(self._delay_table):
            return self._delay_table[level - 1]
        return 1000

    @property
    def index_file_size(self) -> int:
        """Bytes of one IndexFile: 40 + 4 * slots + 20 * entries."""
        return _index_size(self.max_hash_slot_num, self.max_index_num)

    # --- retention (docs/recovery.md#retention) ---------------------------------

    @property
    def delete_physic_files_interval(self) -> int:
        """ms between two CommitLog file deletions: RocketMQ's
        ``deleteCommitLogFilesInterval`` (the cleaner's local variable name)."""
        return self.delete_commit_log_files_interval

    @property
    def destroy_mapped_file_interval_forcibly(self) -> int:
        """ms after which a file still referenced by readers is released anyway
        (RocketMQ's misspelt ``destroyMapedFileIntervalForcibly``)."""
        return self.destroy_maped_file_interval_forcibly

    @property
    def delete_hours(self) -> frozenset:
        """The local hours of day (ints 0-23) named by ``delete_when``."""
        return _parse_hours(self.delete_when)

    @property
    def disk_space_warning_level(self) -> float:
        """``disk_space_warning_level_ratio`` as a fraction clamped to [0.35, 0.90]
        (RocketMQ 5.x): above it puts are refused (DISK_FULL) and clean-up is forced."""
        return min(0.90, max(0.35, self.disk_space_warning_level_ratio / 100.0))

    @property
    def disk_space_clean_forcibly_level(self) -> float:
        """``disk_space_clean_forcibly_ratio`` as a fraction clamped to [0.30, 0.85]:
        above it every non-current CommitLog file may be deleted regardless of age."""
        return min(0.85, max(0.30, self.disk_space_clean_forcibly_ratio / 100.0))

    @property
    def disk_max_used_space_level(self) -> float:
        """``disk_max_used_space_ratio`` clamped to [10, 95] percent, as a fraction:
        above it expired files are deleted outside the ``delete_when`` hours."""
        return min(95, max(10, self.disk_max_used_space_ratio)) / 100.0

    # --- loading --------------------------------------------------------------

    @classmethod
    def broker_defaults(cls, **changes) -> StoreConfig:
        """RocketMQ's ``MessageStoreConfig`` defaults, file sizes included (a
        1 GiB CommitLog segment, 300,000-unit ConsumeQueue files, 5,000,000
        hash slots and 20,000,000 entries per IndexFile), with *changes*
        (field names) applied. Raises ConfigError for invalid values."""
        return cls(**{**BROKER_SIZES, **changes})

    @classmethod
    def from_dict(cls, values: dict, strict: bool = True, base: StoreConfig | None = None) -> StoreConfig:
        """Build a config from a mapping whose keys are either the snake_case
        field names or RocketMQ's camelCase names (``mappedFileSizeCommitLog``).
        String values (as in a ``.properties`` file) are converted to the field's
        type. Unknown names raise :class:`ConfigError` when *strict*, and are
        ignored otherwise. Names not given keep *base*'s values (default:
        ``StoreConfig()``)."""
        known = {f.name: f for f in fields(cls) if f.init}
        kwargs = {}
        for raw_name, value in values.items():
            name = raw_name if raw_name in known else _camel_to_snake(raw_name)
            name = _ALIASES.get(name, name)
            if name not in known and "maped_" in name:  # RocketMQ's older spelling (mapedFileSizeCommitLog)
                name = name.replace("maped_", "mapped_")
            f = known.get(name)
            if f is None:
                if strict:
                    raise ConfigError(f"unknown store config name {raw_name!r}")
                continue
            kwargs[name] = _convert(name, type(f.default), value)
        return cls(**kwargs) if base is None else base.replace(**kwargs)

    @classmethod
    def from_properties(cls, path) -> StoreConfig:
        """Load a broker ``.properties`` file (``name=value``, ``name: value``
        or ``name value`` lines, ``#``/``!`` comments), read as ISO-8859-1 as
        Java's ``Properties.load`` reads a stream (so no byte is an encoding
        error). Names that are not store settings are ignored; settings it
        does not name have a broker's defaults (:meth:`broker_defaults`), as
        the broker that reads the file has.

        Raises OSError (no such file, a directory), ConfigError (a value out
        of its range, see the fields)."""
        return cls.from_dict(read_properties(path), strict=False, base=cls.broker_defaults())

    def replace(self, **changes) -> StoreConfig:
        """A copy with *changes* applied (``dataclasses.replace``)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Field values by snake_case name."""
        return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

INT32_MAX = (1 << 31) - 1
INT64_MAX = (1 << 63) - 1


def _index_size(hash_slot_num: int, index_num: int) -> int:
    """Bytes of an IndexFile: 40 + 4 * slots + 20 * entries."""
    return INDEX_HEADER_SIZE + INDEX_HASH_SLOT_SIZE * hash_slot_num + INDEX_ENTRY_SIZE * index_num


_MS = "ms, a Java int"
_SPIN = "ms between two runs of a thread: 0 would make it spin"
#: name -> (lowest, highest, why): the allowed values of every int field. The
#: bounds are RocketMQ's meaning of the field (its Java ints), narrowed where
#: a value could not work: a thread that would spin, a query or clean-up
#: round that could do nothing, a file too small for one record or too
#: large for the format's int32 positions.
_INT_RANGES = {
    "mapped_file_size_commit_log": (
        4096, INT32_MAX, "bytes per CommitLog file: room for a record, int32 positions in the file"),
    "mapped_file_size_consume_queue": (
        CQ_STORE_UNIT_SIZE, INT32_MAX // CQ_STORE_UNIT_SIZE * CQ_STORE_UNIT_SIZE,
        "bytes per ConsumeQueue file, rounded up to 20-byte units: at least one unit, int32 positions"),
    "max_hash_slot_num": (1, (INT32_MAX - INDEX_HEADER_SIZE - 2 * INDEX_ENTRY_SIZE) // INDEX_HASH_SLOT_SIZE,
                          "hash slots per index file: at least one"),
    "max_index_num": (2, (INT32_MAX - INDEX_HEADER_SIZE - INDEX_HASH_SLOT_SIZE) // INDEX_ENTRY_SIZE,
                      "entries per index file, entry 0 unused: room for one key"),
    "max_message_size": (1, INT32_MAX - MIN_RECORD_SIZE, "bytes of a body: its length is a record's int32"),
    "max_topic_length": (0, MAX_TOPIC_LENGTH_V1, "bytes of a topic written with a one-byte length"),
    "flush_interval_commit_log": (1, INT32_MAX, _SPIN),
    "flush_commit_log_least_pages": (0, INT32_MAX, "dirty 4 KiB pages before a flush, 0 for any byte"),
    "flush_commit_log_thorough_interval": (0, INT32_MAX, _MS),
    "sync_flush_timeout": (1, INT32_MAX, "ms a SYNC_FLUSH put waits for the disk"),
    "flush_interval_consume_queue": (1, INT32_MAX, _SPIN),
    "flush_consume_queue_least_pages": (0, INT32_MAX, "dirty 4 KiB pages before a flush, 0 for any byte"),
    "flush_consume_queue_thorough_interval": (0, INT32_MAX, _MS),
    "max_msgs_num_batch": (1, INT32_MAX, "offsets query_offsets returns at most: 0 would find nothing"),
    "default_query_max_num": (1, INT32_MAX, "messages a query returns by default: 0 would find nothing"),
    "file_reserved_time": (0, INT32_MAX, "hours a file is kept"),
    "disk_max_used_space_ratio": (0, 100, "percent of the disk"),
    "disk_space_warning_level_ratio": (0, 100, "percent of the disk"),
    "disk_space_clean_forcibly_ratio": (0, 100, "percent of the disk"),
    "clean_resource_interval": (1, INT32_MAX, _SPIN),
    "delete_commit_log_files_interval": (0, INT32_MAX, _MS),
    "delete_consume_queue_files_interval": (0, INT32_MAX, _MS),
    "destroy_maped_file_interval_forcibly": (0, INT32_MAX, _MS),
    "redelete_hanged_file_interval": (0, INT32_MAX, _MS),
    "delete_file_batch_max": (1, INT32_MAX, "files one clean-up round deletes: 0 would delete none"),
    "clean_resource_initial_delay": (0, INT32_MAX, _MS),
    "disk_check_interval": (0, INT32_MAX, _MS),
    "follow_poll_interval": (1, INT32_MAX, _SPIN),
    "flush_least_pages_when_warm_maped_file": (1, INT32_MAX, "pages warmed per step: 0 would warm none"),
    "max_transfer_count_on_message_in_memory": (1, INT32_MAX, "messages one pull transfers: 0 would move none"),
    "max_transfer_bytes_on_message_in_memory": (1, INT32_MAX, "bytes one pull transfers: 0 would move none"),
}


def _convert(name, want, value):
    if isinstance(value, str) and want is not str:
        text = value.strip()
        if want is bool:
            if text.lower() in ("true", "1", "yes"):
                return True
            if text.lower() in ("false", "0", "no"):
                return False
            raise ConfigError(f"{name}: {value!r} is not a boolean")
        if not _JAVA_INT.fullmatch(text):  # what Integer.parseInt reads: no "1_000", "1e3", " 1 2", "١"
            raise ConfigError(f"{name}: {value!r} is not an integer")
        return int(text)
    return value


_JAVA_INT = re.compile(r"[+-]?[0-9]+")


# names RocketMQ uses for the same setting elsewhere (cleaner locals, spelling)
_ALIASES = {
    "delete_physic_files_interval": "delete_commit_log_files_interval",
    "destroy_mapped_file_interval_forcibly": "destroy_maped_file_interval_forcibly",
}


def read_properties(path) -> dict:
    """The ``name -> value`` text pairs of a Java ``.properties`` file (a
    broker's ``broker.conf``): ``name=value``, ``name: value`` or ``name
    value`` lines, ``#``/``!`` comments, read as ISO-8859-1 as Java's
    ``Properties.load`` reads a stream (so no byte is an encoding error); a
    later line wins. Raises OSError (no such file, a directory)."""
    values = {}
    with open(path, encoding="iso-8859-1") as fh:
        for line in fh:
            line = line.strip()
            if not line or line[0] in "#!":
                continue
            m = re.match(r"([^=:\s]+)\s*(?:[=:]\s*|\s)(.*)", line)
            if m:
                values[m.group(1)] = m.group(2)
    return values


def _parse_hours(text: str) -> frozenset:
    """``deleteWhen``: hours of day separated by ``;`` ("04", "03;04")."""
    hours = set()
    for item in text.split(";"):
        item = item.strip()
        if not item:
            continue
        if not _DIGITS.fullmatch(item) or not 0 <= int(item) <= 23:
            raise ConfigError(f"delete_when: {item!r} is not an hour of day (0-23)")
        hours.add(int(item))
    return frozenset(hours)


_DIGITS = re.compile(r"[0-9]+")


def _parse_delay_levels(text: str) -> tuple:
    """``messageDelayLevel``: levels separated by spaces, each a count of
    ``s``, ``m``, ``h`` or ``d`` (RocketMQ's parse), in ms within a long."""
    out = []
    for item in text.split():
        unit = _DELAY_UNITS.get(item[-1:])
        digits = item[:-1]
        if unit is None or not _DIGITS.fullmatch(digits) or int(digits) * unit > INT64_MAX:
            raise ConfigError(
                f"message_delay_level: bad level {item!r} (want a count of s, m, h or d, at most {INT64_MAX} ms)"
            )
        out.append(int(digits) * unit)
    return tuple(out)
