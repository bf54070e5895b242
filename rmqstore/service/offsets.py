"""Consumer offsets in RocketMQ's ``config/consumerOffset.json``.

RocketMQ's broker keeps, for every consumer group, the next queue offset to
consume of every queue it reads (``ConsumerOffsetManager``, persisted through
``ConfigManager.persist()`` every ``flushConsumerOffsetInterval`` = 5000 ms and
at shutdown). :class:`ConsumerOffsetStore` keeps the same table in the same
file, so a broker started on a store directory that rmqstore wrote finds the
offsets, and rmqstore reads the offsets a broker wrote.

File format (fastjson 1.2.83, ``JSON.toJSONString(manager, prettyFormat)``;
RocketMQ 5.x, ``broker/.../offset/ConsumerOffsetManager.java``)::

    {
    	"dataVersion":{
    		"counter":0,
    		"stateVersion":0,
    		"timestamp":1726732800000
    	},
    	"groupTopicMap":{
    		"OrderGroup":["Orders"]
    	},
    	"offsetTable":{
    		"Orders@OrderGroup":{"0":42,"1":17
    		}
    	}
    }

* ``offsetTable`` maps ``"<topic>@<group>"`` to a map from queue id to the
  next queue offset to consume (RocketMQ's ``ConcurrentMap<Integer, Long>``).
* ``dataVersion`` (RocketMQ 5.0+): ``counter`` advances by one every 500
  commits (``consumerOffsetUpdateVersionStep``), together with ``timestamp``
  (ms); ``stateVersion`` is the message store's state-machine version, 0 here.
* ``groupTopicMap`` (RocketMQ 5.0+; 4.x files have neither member) is
  derived: fastjson serializes the getter ``getGroupTopicMap()``, group ->
  topics. It is written, and ignored on load as RocketMQ ignores it (it
  has no setter).
* Other top-level fields (``lmqOffsetTable`` of a broker with LMQ enabled, a
  future field) are kept as they are and written back.
* Members appear in fastjson's order (alphabetical), pretty-printed with tabs.

Two deliberate differences from the bytes a broker writes, neither of which
matters to a broker (fastjson reads both spellings):

* queue ids are written as JSON strings (``"0":42``). fastjson writes Integer
  map keys bare (``{0:42}``), which is not JSON; rmqstore writes strict JSON
  so any JSON parser reads the file, and reads the bare form too.
* the file is replaced atomically (see :meth:`ConsumerOffsetStore.persist`).
  RocketMQ up to 5.0 wrote ``.tmp``, copied the old file to ``.bak``,
  deleted the file and renamed ``.tmp`` over it, without fsync
  (``MixAll.string2File``; a crash could leave no file, issue #5905);
  5.1.0-5.3.x copy the old file to ``.bak`` and overwrite the file in place,
  without fsync; #9706 (on master after 5.3.3, in no release as of
  September 2025) moves the file to ``.bak``, then writes and forces a new
  one. Every generation keeps the previous version as ``<file>.bak`` and
  falls back to it on load, and so does rmqstore.

Topic and group names: RocketMQ allows only ``^[%|a-zA-Z0-9_-]+$``
(``TopicValidator``), so ``@`` never occurs in them and the broker splits keys
on ``@``. rmqstore's topics may hold other characters; only ``@`` (which would
make the key ambiguous), empty names and names that cannot be written as
UTF-8 (lone surrogates: the file could never be saved again) are refused when
committing.

A file is read whole or not at all (:func:`parse_offset_json` says what it
accepts): one that is not an offset table, at any level, is a
:class:`~rmqstore.exceptions.CorruptedFileError` naming it, and loading falls
back to ``.bak``.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
import re
import threading
import time
from collections.abc import Callable

from ..exceptions import (
    CorruptedFileError,
    IllegalMessageError,
    MessageTypeError,
    StoreClosedError,
    StoreReadOnlyError,
)
from ..storage.mapped_file import _NOFOLLOW, fsync_dir

__all__ = [
    "CONSUMER_OFFSET_FILE",
    "FLUSH_CONSUMER_OFFSET_INTERVAL_MS",
    "TOPIC_GROUP_SEPARATOR",
    "ConsumerOffsetStore",
    "offset_key",
    "parse_offset_json",
    "split_offset_key",
]

log = logging.getLogger("rmqstore.offsets")

#: the file under a store root (RocketMQ ``BrokerPathConfigHelper.getConsumerOffsetPath``)
CONSUMER_OFFSET_FILE = os.path.join("config", "consumerOffset.json")
#: RocketMQ ``ConsumerOffsetManager.TOPIC_GROUP_SEPARATOR``
TOPIC_GROUP_SEPARATOR = "@"
#: RocketMQ ``BrokerConfig.flushConsumerOffsetInterval`` default (ms)
FLUSH_CONSUMER_OFFSET_INTERVAL_MS = 5000
#: RocketMQ ``BrokerConfig.consumerOffsetUpdateVersionStep`` default (commits per dataVersion step)
OFFSET_UPDATE_VERSION_STEP = 500

_INT32_MAX = (1 << 31) - 1
_INT64_MAX = (1 << 63) - 1
_TOP_LEVEL_DERIVED = ("groupTopicMap",)

# a JSON string (skipped as a whole), or a bare integer object key as fastjson
# writes Integer map keys: {0:42,1:17}
_BARE_KEY = re.compile(r'"(?:[^"\\]|\\.)*"|([{,])(\s*)(-?\d+)(\s*):', re.DOTALL)


def _now_ms() -> int:
    return time.time_ns() // 1_000_000


# --- names and keys --------------------------------------------------------------------


def _check_name(what: str, value) -> str:
    if not isinstance(value, str):
        raise MessageTypeError(f"{what} must be a str, got {type(value).__name__}")
    if not value:
        raise IllegalMessageError(f"{what} must not be empty")
    if TOPIC_GROUP_SEPARATOR in value:
        raise IllegalMessageError(
            f"{what} {value!r} contains '@': RocketMQ keys offsets by '<topic>@<group>' and splits them at '@'"
        )
    if not value.isascii():
        try:
            value.encode("utf-8")
        except UnicodeEncodeError:  # a lone surrogate: the table could never be saved again
            raise IllegalMessageError(f"{what} {value!r} cannot be written as UTF-8") from None
    return value


def _check_queue_id(queue_id) -> int:
    if isinstance(queue_id, bool) or not isinstance(queue_id, int):
        raise MessageTypeError(f"queue_id must be an int, got {type(queue_id).__name__}")
    if not 0 <= queue_id <= _INT32_MAX:
        raise IllegalMessageError(f"queue_id={queue_id} is out of range [0, {_INT32_MAX}]")
    return queue_id


def _check_offset(offset) -> int:
    if isinstance(offset, bool) or not isinstance(offset, int):
        raise MessageTypeError(f"offset must be an int, got {type(offset).__name__}")
    if not 0 <= offset <= _INT64_MAX:
        raise IllegalMessageError(
            f"offset={offset} is out of range [0, {_INT64_MAX}] (RocketMQ reads a negative offset as 'none')"
        )
    return offset


def offset_key(group: str, topic: str) -> str:
    """RocketMQ's offset-table key ``"<topic>@<group>"`` (topic first)."""
    return f"{topic}{TOPIC_GROUP_SEPARATOR}{group}"


def split_offset_key(key: str):
    """``(topic, group)`` of an offset-table key, or None when it does not hold
    exactly one ``@`` (RocketMQ skips such keys when it splits them, e.g. the
    ``<topic>@<group>@broadcast`` entries of its broadcast offset manager)."""
    parts = key.split(TOPIC_GROUP_SEPARATOR)
    if len(parts) != 2 or not parts[0] or not parts[1]:
        return None
    return parts[0], parts[1]


# --- reading -----------------------------------------------------------------------------


def _quote_bare_keys(text: str) -> str:
    def repl(m):
        if m.group(1) is None:
            return m.group(0)
        return f'{m.group(1)}{m.group(2)}"{m.group(3)}"{m.group(4)}:'

    return _BARE_KEY.sub(repl, text)


def _as_int(value, what: str, lo: int, hi: int) -> int:
    # fastjson reads a number, or a string holding one, into Integer/Long
    if isinstance(value, bool):
        raise ValueError(f"{what} is a boolean")
    if isinstance(value, str):
        value = value.strip()
        if not re.fullmatch(r"[+-]?\d+", value):
            raise ValueError(f"{what} {value!r} is not an integer")
        value = int(value)
    elif isinstance(value, float):
        if not value.is_integer():
            raise ValueError(f"{what} {value!r} is not an integer")
        value = int(value)
    elif not isinstance(value, int):
        raise ValueError(f"{what} is a {type(value).__name__}, not an integer")
    if not lo <= value <= hi:
        raise ValueError(f"{what} {value} is out of range [{lo}, {hi}]")
    return value


def _writable(what: str, value) -> None:
    """ValueError unless *value* (read from a file) can be written back as UTF-8
    JSON: a ``\\ud800`` escape reads as a lone surrogate, which no later
    persist could write."""
    try:
        (value if isinstance(value, str) else _compact(value)).encode("utf-8")
    except (UnicodeEncodeError, RecursionError, TypeError) as e:
        raise ValueError(f"{what} cannot be written back: {e}") from None


def _loads(text: str):
    try:
        return json.loads(text)
    except RecursionError:  # nested deeper than the parser goes
        raise ValueError("nested too deeply") from None


def load_json_object(text: str) -> dict:
    """The top-level object of a broker config file's *text* (``config/*.json``,
    fastjson's): a leading BOM dropped, bare integer map keys (``{0:42}``,
    not JSON) read too. ValueError when it is not a JSON object."""
    text = text.removeprefix("\ufeff")
    try:
        doc = _loads(text)
    except ValueError:
        doc = _loads(_quote_bare_keys(text))  # fastjson's {0:42}
    if not isinstance(doc, dict):
        raise ValueError(f"top level is a {type(doc).__name__}, not an object")
    return doc


def parse_offset_json(text: str) -> dict:
    """Parse the text of a ``consumerOffset.json`` (ours, or a broker's with bare
    integer keys) into ``{"offsetTable": {key: {queue_id: offset}}, "dataVersion":
    dict | None, "extra": {name: value}}``; queue ids and offsets are ints.
    ``groupTopicMap`` is dropped (derived).

    What is read is what fastjson reads into RocketMQ's table: queue ids and
    offsets as JSON numbers or strings holding an integer, in Integer and
    Long range (a negative offset, RocketMQ's "none", is kept as read), an
    entry that is null skipped; keys as they are (one without ``@`` too).
    Anything else — another shape at any level, a value of another type, a
    document nested deeper than the parser goes, a string no persist could
    write back (a lone surrogate escape) — makes the whole document bad: no
    entry is guessed at or dropped.

    Raises ValueError when the text is not such a document."""
    doc = load_json_object(text)
    table: dict = {}
    raw_table = doc.get("offsetTable")
    if raw_table is not None:
        if not isinstance(raw_table, dict):
            raise ValueError("offsetTable is not an object")
        for key, queues in raw_table.items():
            _writable("an offsetTable key", key)
            if queues is None:
                continue
            if not isinstance(queues, dict):
                raise ValueError(f"offsetTable[{key!r}] is not an object")
            qmap = {}
            for qid, off in queues.items():
                q = _as_int(qid, f"queue id of {key!r}", -(1 << 31), _INT32_MAX)
                if off is None:
                    continue
                qmap[q] = _as_int(off, f"offset of {key!r} queue {q}", -(1 << 63), _INT64_MAX)
            table[key] = qmap
    version = doc.get("dataVersion")
    if version is not None:
        if not isinstance(version, dict):
            raise ValueError("dataVersion is not an object")
        version = {
            "counter": _as_int(version.get("counter", 0), "dataVersion.counter", -(1 << 63), _INT64_MAX),
            "stateVersion": _as_int(version.get("stateVersion", 0), "dataVersion.stateVersion", -(1 << 63), _INT64_MAX),
            "timestamp": _as_int(version.get("timestamp", 0), "dataVersion.timestamp", -(1 << 63), _INT64_MAX),
        }
    extra = {
        k: v for k, v in doc.items() if k not in ("offsetTable", "dataVersion") and k not in _TOP_LEVEL_DERIVED
    }
    for name, value in extra.items():  # written back as read
        _writable(f"member {name!r}", name)
        _writable(f"member {name!r}", value)
    return {"offsetTable": table, "dataVersion": version, "extra": extra}


def _read_offset_file(path):
    """(parsed, stat) of the offset file *path*; parsed is None for a missing
    (stat None too) or empty file. Raises CorruptedFileError when it does not
    parse."""
    try:
        with open(path, "rb") as fh:
            st = os.fstat(fh.fileno())
            data = fh.read()
    except FileNotFoundError:
        return None, None
    if not data.strip():
        return None, st
    try:
        return parse_offset_json(data.decode("utf-8")), st
    except (ValueError, UnicodeDecodeError) as e:
        raise CorruptedFileError(f"not a consumerOffset.json: {e}", path) from None


# --- writing -----------------------------------------------------------------------------


def _js(s: str) -> str:
    return json.dumps(s, ensure_ascii=False)


def _compact(value) -> str:
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"))


def encode_data_version(dv: dict) -> str:
    """A ``dataVersion`` member's value (``counter``, ``stateVersion``,
    ``timestamp``) in fastjson's pretty layout, as a top-level member."""
    return (
        "{\n"
        f'\t\t"counter":{int(dv["counter"])},\n'
        f'\t\t"stateVersion":{int(dv["stateVersion"])},\n'
        f'\t\t"timestamp":{int(dv["timestamp"])}\n'
        "\t}"
    )


def encode_offset_json(table: dict, data_version: dict, extra=None) -> str:
    """The file text for *table* (``{"<topic>@<group>": {queue_id: offset}}``), in
    fastjson's pretty layout (tabs, members in alphabetical order, queue maps on
    one line with the closing brace on the next), queue ids quoted."""
    members = {"dataVersion": encode_data_version(data_version)}
    group_topics: dict = {}
    for key in table:
        tg = split_offset_key(key)
        if tg is not None:
            group_topics.setdefault(tg[1], set()).add(tg[0])
    if group_topics:
        members["groupTopicMap"] = (
            "{"
            + ",".join(f"\n\t\t{_js(g)}:{_compact(sorted(ts))}" for g, ts in group_topics.items())
            + "\n\t}"
        )
    else:
        members["groupTopicMap"] = "{}"
    if table:
        rows = []
        for key, queues in table.items():
            inner = ",".join(f'"{q}":{off}' for q, off in sorted(queues.items()))
            rows.append(f"\n\t\t{_js(key)}:{{{inner}\n\t\t}}" if queues else f"\n\t\t{_js(key)}:{{}}")
        members["offsetTable"] = "{" + ",".join(rows) + "\n\t}"
    else:
        members["offsetTable"] = "{}"
    for name, value in (extra or {}).items():
        members.setdefault(name, _compact(value))
    return "{" + ",".join(f"\n\t{_js(name)}:{members[name]}" for name in sorted(members)) + "\n}"


def _write_all(fd: int, data: bytes) -> None:
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _write_new(path: str, data: bytes) -> None:
    """Write *data* to the new file *path* (never through a link left there) and fsync it."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
    try:
        _write_all(fd, data)
        os.fsync(fd)
    finally:
        os.close(fd)


def replace_config_file(path: str, data: bytes, backup: bool = True) -> None:
    """Replace the broker config file *path* (``config/*.json``) by *data*
    atomically, keeping the previous version as ``<path>.bak`` when *backup*
    (pass False while the current file is one that failed to parse: the good
    ``.bak`` then stays), as RocketMQ's ``ConfigManager.persist`` keeps one:

    1. write ``<path>.tmp`` and fsync it;
    2. make ``<path>.bak`` the current file: a hard link moved into place
       with a rename (a copy, fsynced, where the file system has no hard
       links);
    3. rename ``<path>.tmp`` over the file;
    4. fsync the directory.

    At every moment the file is a complete version, and so is ``.bak``.
    Raises OSError (the old file is then intact)."""
    _write_new(path + ".tmp", data)
    if backup and os.path.exists(path):
        bak_tmp = path + ".bak.tmp"
        try:
            try:
                os.unlink(bak_tmp)
            except FileNotFoundError:
                pass
            os.link(path, bak_tmp)  # the current version's inode, already on disk
        except OSError:
            with open(path, "rb") as src:
                _write_new(bak_tmp, src.read())
        os.replace(bak_tmp, path + ".bak")
    os.replace(path + ".tmp", path)
    fsync_dir(os.path.dirname(path))


# --- the store ---------------------------------------------------------------------------


class ConsumerOffsetStore:
    """The consumer-offset table of one store (RocketMQ ``ConsumerOffsetManager``).

    Args:
        path (str | PathLike): the JSON file, normally
            ``<store root>/config/consumerOffset.json``.
        sync (bool): default for :meth:`commit`. True (the default): a commit
            returns once the whole table is on disk, so a committed offset
            survives a crash or power loss. False: commits only mark the table
            dirty; it is persisted every *flush_interval_ms*, by :meth:`flush`
            and by :meth:`close`, as a broker does (a crash then loses up to
            one interval of commits: consumers re-read those messages).
        flush_interval_ms (int): period of the background persist for deferred
            commits (RocketMQ ``flushConsumerOffsetInterval``, 5000 ms).
        read_only (bool): never write; :meth:`get` re-reads the file when it
            changed (a writer beside us).
        owner_closed (callable | None): returns True once the owning store is
            closed or crashed; the background persist then stops without
            writing (a dropped store must not write behind a new one).

    Several processes may commit to one file (the writer's store and
    read-only followers): a persist takes an exclusive ``flock`` on
    ``<file>.lock``, reads the file when another process replaced it since
    this one last read or wrote it, lays this process's commits not yet
    persisted over it and replaces the file atomically, so no process's
    commit is lost (per queue the last persist wins). Lookups take in what
    other processes persisted the same way. A broker running on the same
    directory does not take that lock: it must not run beside rmqstore.
    Every method is thread-safe.
    """

    def __init__(self, path, sync: bool = True, flush_interval_ms: int = FLUSH_CONSUMER_OFFSET_INTERVAL_MS,
                 read_only: bool = False, owner_closed: Callable[[], bool] | None = None):
        if isinstance(flush_interval_ms, bool) or not isinstance(flush_interval_ms, int) \
                or not 0 < flush_interval_ms <= _INT32_MAX:  # (0 would make the persist thread spin)
            raise IllegalMessageError(
                f"flush_interval_ms must be an int in [1, {_INT32_MAX}], got {flush_interval_ms!r}"
            )
        self.path = os.path.abspath(os.fspath(path))
        self.sync = bool(sync)
        self.flush_interval_ms = flush_interval_ms
        self.read_only = read_only
        self._owner_closed = owner_closed
        self._lock = threading.Lock()  # the table
        self._persist_lock = threading.Lock()  # one file replacement at a time
        self._table: dict = {}  # "<topic>@<group>" -> {queue_id: offset}
        # this process's commits not yet persisted, laid over what others wrote
        self._pending: dict = {}  # "<topic>@<group>" -> {queue_id: offset}
        self._extra: dict = {}  # unknown top-level members, written back as read
        self._data_version = {"counter": 0, "stateVersion": 0, "timestamp": _now_ms()}
        self._commits = 0  # RocketMQ's transient versionChangeCounter
        self._version = 0  # bumped by every change
        self._persisted_version = 0
        self._main_good = False  # the file holds a version we read or wrote (safe to keep as .bak)
        self._loaded_stat = None
        self._loaded_from = None
        self._closed = False
        self._flusher: threading.Thread | None = None
        self._stop = threading.Event()
        self.last_error: BaseException | None = None  # of the background persist

    # --- loading ----------------------------------------------------------------------

    @property
    def bak_path(self) -> str:
        return self.path + ".bak"

    @property
    def loaded_from(self):
        """Which file :meth:`load` read: the file's path, the ``.bak`` path, or None (neither existed)."""
        return self._loaded_from

    def load(self) -> bool:
        """Read the table from the file, falling back to ``<file>.bak`` when the
        file is missing, empty or does not parse (RocketMQ ``ConfigManager.load``).
        Neither file existing is an empty table. Returns whether a file was read.

        Unlike RocketMQ, a bad file is never deleted here (read-only stores load
        too); the next :meth:`persist` replaces it and keeps the good ``.bak``.

        Raises:
            CorruptedFileError: the file exists with content that does not parse
                (is not an offset table: see :func:`parse_offset_json`)
                and ``.bak`` is missing or does not parse either (RocketMQ would
                start with an empty table when ``.bak`` is missing, so every
                group would re-consume from the start; rmqstore refuses
                instead), or the file is missing/empty and ``.bak`` is bad.
        """
        main_error = None
        try:
            parsed, st = _read_offset_file(self.path)
        except CorruptedFileError as e:
            parsed, st, main_error = None, None, e
        main_good = parsed is not None
        source = self.path if main_good else None
        if parsed is None:
            if main_error is not None:
                log.warning("%s; trying %s", main_error, self.bak_path)
            try:
                parsed, _ = _read_offset_file(self.bak_path)
            except CorruptedFileError as e:
                raise CorruptedFileError(
                    "neither the consumer-offset file nor its .bak parses "
                    f"({main_error or 'file missing or empty'}; {e})",
                    self.path,
                ) from None
            if parsed is None and main_error is not None:
                raise CorruptedFileError(f"{main_error} and there is no usable {self.bak_path}", self.path) from None
            if parsed is not None:
                source = self.bak_path
                log.warning("loaded consumer offsets from %s", self.bak_path)
        with self._lock:
            if parsed is None:
                self._table, self._extra = {}, {}
            else:
                self._table = parsed["offsetTable"]
                self._extra = parsed["extra"]
                if parsed["dataVersion"] is not None:
                    self._data_version = parsed["dataVersion"]
            self._main_good = main_good
            self._loaded_stat = _stat_key(st)
            self._loaded_from = source
            self._version += 1
            self._persisted_version = self._version  # what we hold is what is on disk
        return source is not None

    def _refresh(self) -> None:
        """Take in what another process persisted since this one last read or
        wrote the file: its table, with this process's commits not yet
        persisted laid over it. A file that is missing, empty or does not
        parse leaves the table as it is (a persist replaces it, keeping the
        good ``.bak``)."""
        try:
            key = _stat_key(os.stat(self.path))
        except FileNotFoundError:
            key = None
        if key == self._loaded_stat:
            return
        try:
            parsed, st = _read_offset_file(self.path)
        except CorruptedFileError as e:  # (a writer of an older kind mid-write, or damage)
            log.warning("consumer offsets not re-read: %s", e)
            self._loaded_stat = key
            return
        with self._lock:
            self._loaded_stat = _stat_key(st)
            if parsed is None:
                return
            table = parsed["offsetTable"]
            for k, qmap in self._pending.items():
                table.setdefault(k, {}).update(qmap)
            self._table = table
            self._extra = parsed["extra"]
            dv = parsed["dataVersion"]
            if dv is not None and dv["counter"] >= self._data_version["counter"]:
                self._data_version = dv
            self._main_good = True

    # --- the table ---------------------------------------------------------------------

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError(f"consumer-offset store {self.path} is closed")

    def commit(self, group: str, topic: str, queue_id: int, offset: int, sync=None) -> None:
        """Record that *group* consumed *queue_id* of *topic* up to queue offset
        *offset* (exclusive): *offset* is the next message to consume (RocketMQ
        ``commitOffset``). A smaller offset than the stored one is accepted (a
        reset), as RocketMQ does (it only logs it).

        Args:
            group (str), topic (str): non-empty, without ``@``, UTF-8 encodable.
            queue_id (int): 0 .. 2**31-1.
            offset (int): 0 .. 2**63-1 (a queue offset, not a physical one).
            sync (bool | None): persist before returning; None = :attr:`sync`.

        Raises:
            MessageTypeError: an argument has the wrong type.
            IllegalMessageError: empty name, ``@`` in a name, a name with a lone
                surrogate, value out of range.
            StoreReadOnlyError: opened read-only.
            StoreClosedError: after :meth:`close`.
            OSError: the file could not be written (the table in memory holds
                the commit; it is written by the next successful persist).
        """
        self.commit_many(group, topic, {queue_id: offset}, sync)

    def commit_many(self, group: str, topic: str, offsets: dict, sync=None) -> None:
        """:meth:`commit` for several queues of one group and topic
        (``{queue_id: offset}``), with one persist. Same errors."""
        key = offset_key(_check_name("group", group), _check_name("topic", topic))
        if not isinstance(offsets, dict):
            raise MessageTypeError(f"offsets must be a dict, got {type(offsets).__name__}")
        self._commit_checked(key, {_check_queue_id(q): _check_offset(o) for q, o in offsets.items()}, sync)

    def _commit_checked(self, key: str, checked: dict, sync) -> None:
        """:meth:`commit_many` past its argument checks: *key* an offset key,
        *checked* valid ``{queue_id: offset}`` (the Consumer checked its names
        once; a commit per message must not pay for them again)."""
        if self.read_only:
            raise StoreReadOnlyError(f"consumer offsets {self.path} are open read-only")
        with self._lock:
            self._check_open()
            if not checked:
                return
            qmap = self._table.get(key)
            if qmap is None:
                qmap = self._table[key] = {}
            pending = self._pending.get(key)
            if pending is None:
                pending = self._pending[key] = {}
            for q, o in checked.items():
                old = qmap.get(q)
                if old is not None and o < old:
                    log.info("offset of %s queue %d moved back from %d to %d", key, q, old, o)
                qmap[q] = pending[q] = o
                self._commits += 1
                if self._commits % OFFSET_UPDATE_VERSION_STEP == 0:
                    dv = self._data_version
                    dv["counter"] += 1
                    dv["timestamp"] = _now_ms()
                    dv["stateVersion"] = 0
            self._version += 1
            mine = self._version
        if self.sync if sync is None else sync:
            self._persist_covering(mine)
        elif self._flusher is None:
            self._start_flusher()

    def get(self, group: str, topic: str, queue_id: int):
        """The committed offset (next queue offset to consume, an int) of
        *group* on *queue_id* of *topic*, or None if none was committed
        (RocketMQ ``queryOffset`` answers -1). The key ``<topic>@<group>`` is
        looked up as given, so names with ``@`` read RocketMQ's own entries
        (e.g. group ``"G@broadcast"``).

        Raises MessageTypeError for wrong types."""
        if not isinstance(group, str) or not isinstance(topic, str):
            raise MessageTypeError("group and topic must be str")
        _check_queue_id(queue_id)
        self._refresh()
        with self._lock:
            qmap = self._table.get(offset_key(group, topic))
            return None if qmap is None else qmap.get(queue_id)

    def get_all(self, group: str, topic: str) -> dict:
        """``{queue_id: offset}`` committed by *group* on *topic* (empty if none)."""
        if not isinstance(group, str) or not isinstance(topic, str):
            raise MessageTypeError("group and topic must be str")
        self._refresh()
        with self._lock:
            return dict(self._table.get(offset_key(group, topic), {}))

    def table(self) -> dict:
        """A copy of the whole table: ``{"<topic>@<group>": {queue_id: offset}}``,
        keys as stored (including keys rmqstore would not write)."""
        self._refresh()
        with self._lock:
            return {k: dict(v) for k, v in self._table.items()}

    def group_topic_map(self) -> dict:
        """``{group: sorted topics}`` (RocketMQ ``getGroupTopicMap``)."""
        out: dict = {}
        for key in self.table():
            tg = split_offset_key(key)
            if tg is not None:
                out.setdefault(tg[1], set()).add(tg[0])
        return {g: sorted(ts) for g, ts in out.items()}

    @property
    def data_version(self) -> dict:
        """``{"counter", "stateVersion", "timestamp"}`` as the file holds them."""
        with self._lock:
            return dict(self._data_version)

    @property
    def dirty(self) -> bool:
        """Whether commits are waiting to be persisted."""
        return self._version > self._persisted_version

    def encode(self) -> str:
        """The file text for the current table (see the module docstring)."""
        with self._lock:
            return encode_offset_json(self._table, self._data_version, self._extra)

    # --- persisting --------------------------------------------------------------------

    def persist(self) -> None:
        """Write the table to the file atomically (:func:`replace_config_file`,
        RocketMQ ``ConfigManager.persist``), keeping the previous version as
        ``<file>.bak`` if it is one this store read or wrote (never a file
        that failed to parse: the good ``.bak`` stays).

        Raises StoreReadOnlyError, StoreClosedError, OSError (the old file is
        then intact)."""
        if self.read_only:
            raise StoreReadOnlyError(f"consumer offsets {self.path} are open read-only")
        self._check_open()
        self._persist_covering(None)

    def _persist_covering(self, version) -> None:
        """Persist unless a persist that started after change *version* already
        finished (group commit for concurrent committers); None = always."""
        with self._persist_lock:
            if version is not None and self._persisted_version >= version:
                return
            with self._file_lock():  # (other processes' persists: read, merge, replace as one step)
                self._refresh()
                with self._lock:
                    text = encode_offset_json(self._table, self._data_version, self._extra)
                    snapshot = self._version
                    sent = {k: dict(qmap) for k, qmap in self._pending.items()}
                self._replace_file(text.encode("utf-8"))
            self._persisted_version = max(self._persisted_version, snapshot)
            with self._lock:  # persisted: no longer laid over what others write (unless committed again since)
                for k, qmap in sent.items():
                    mine = self._pending.get(k)
                    if mine is None:
                        continue
                    for q, o in qmap.items():
                        if mine.get(q) == o:
                            del mine[q]
                    if not mine:
                        del self._pending[k]

    @contextlib.contextmanager
    def _file_lock(self):
        """An exclusive ``flock`` on ``<file>.lock`` (made once, never
        removed: removing a lock file races with its next taker), released
        on leaving, by an exception or interrupt too."""
        directory = os.path.dirname(self.path)
        if not os.path.isdir(directory):
            os.makedirs(directory, exist_ok=True)
            fsync_dir(os.path.dirname(directory))
        fd = os.open(self.path + ".lock", os.O_RDWR | os.O_CREAT | _NOFOLLOW | getattr(os, "O_CLOEXEC", 0), 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)

    def _replace_file(self, data: bytes) -> None:
        replace_config_file(self.path, data, backup=self._main_good)
        self._main_good = True
        try:
            self._loaded_stat = _stat_key(os.stat(self.path))
        except OSError:  # pragma: no cover
            pass

    def flush(self) -> None:
        """Persist if commits are waiting (deferred commits). No-op when read-only."""
        if self.read_only or not self.dirty:
            return
        self._check_open()
        self._persist_covering(self._version)

    def _start_flusher(self) -> None:
        if self._flusher is not None:
            return
        with self._persist_lock:
            if self._flusher is not None or self._closed:
                return
            t = threading.Thread(target=self._flush_loop, name=f"rmqstore-offsets:{self.path}", daemon=True)
            t.start()
            self._flusher = t  # published once started: close() in another thread may join it at once

    def _flush_loop(self) -> None:
        """Persist deferred commits every :attr:`flush_interval_ms` (RocketMQ's
        scheduled ``consumerOffsetManager.persist()``)."""
        while not self._stop.wait(self.flush_interval_ms / 1000):
            owner_closed = self._owner_closed
            if self._closed or (owner_closed is not None and owner_closed()):
                return  # closed, or the owner was dropped like a killed process: write nothing
            try:
                if self.dirty:
                    self._persist_covering(self._version)
                self.last_error = None
            except Exception as e:  # kept dirty: the next round or close() retries
                self.last_error = e
                log.error("persisting consumer offsets to %s failed: %s", self.path, e)

    def close(self) -> None:
        """Persist waiting commits, stop the background persist; idempotent.
        Raises OSError when the final persist fails (the store is closed anyway)."""
        if self._closed:
            return
        self._stop.set()
        t = self._flusher
        if t is not None and t is not threading.current_thread():
            t.join()
        try:
            if not self.read_only and self.dirty:
                self._persist_covering(self._version)
        finally:
            self._closed = True

    @property
    def closed(self) -> bool:
        return self._closed

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __repr__(self):
        mode = "read-only" if self.read_only else ("sync" if self.sync else "deferred")
        return f"<ConsumerOffsetStore {self.path!r} {mode}{' closed' if self._closed else ''}>"


def _stat_key(st):
    return None if st is None else (st.st_ino, st.st_size, st.st_mtime_ns)
