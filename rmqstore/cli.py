"""Command line: ``rmqstore <command>`` or ``python -m rmqstore <command>``.

Read commands open the store read-only (no lock), so they work on a copy of a
real broker's store directory and beside a running writer.
"""

from __future__ import annotations

import argparse
import errno
import json
import math
import os
import sys
import time
from datetime import datetime, timezone
from typing import NamedTuple

from . import IMPLEMENTATION, __version__
from .config import StoreConfig, read_properties
from .exceptions import ConfigError, RmqStoreError
from .message import decode_offset_msg_id
from .service.progress import consumer_progress
from .store import MessageStore, StoreLock
from .store.args import MAX_OFFSET, time_ms

__all__ = ["main"]

INT32_MAX = (1 << 31) - 1


class UsageError(Exception):
    """A mistake in what the user asked for (an argument, a path): reported as
    one line on stderr, exit status 2. *prog* names the command when known."""

    def __init__(self, message: str, prog=None):
        super().__init__(message)
        self.prog = prog


def _ts(ms) -> str:
    if ms is None or ms <= 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def _show(path) -> str:
    """*path* as text that any stdout can take: bytes that are not UTF-8 (a
    name made elsewhere, passed through argv) as \\xNN escapes."""
    return os.fsencode(path).decode("utf-8", "backslashreplace")


#: exit status of a read command that read around damage (and said where, on stderr)
EXIT_DAMAGED = 3
# the stores the read commands of this call opened, for what they read around
_opened: list = []


def _open(args) -> MessageStore:
    """The store of *args* (``args.store``), read-only, with the settings of
    ``--broker-conf`` when given (file sizes and index geometry always come
    from the files)."""
    store = MessageStore.open(args.store, config=_config_arg(args), read_only=True)
    _opened.append(store)
    return store


def _damage_seen() -> bool:
    """Say on stderr where the stores the command read are damaged (a
    read-only open reads around damage inside the CommitLog; a store shut
    down cleanly whose last records do not validate is damaged at its end;
    a crash's torn tail and a live writer's unfinished one are not), with
    what to run next. Whether there was any."""
    seen = False
    for s in _opened:
        report = s.recovery_report
        root = _show(s.root_dir)
        damaged = False
        live = StoreLock.is_held(s.root_dir)
        if live:  # (what it writes meanwhile is not damage, nor read)
            print(f"rmqstore: {root}: a writer holds the store: read what it had published when the command "
                  f"opened it", file=sys.stderr)
        for d in report.get("damage", ()):
            print(f"rmqstore: {root}: damage at CommitLog physical offset {d['physical_offset']} ({d['reason']}); "
                  f"read on from {d['resumes_at']}", file=sys.stderr)
            damaged = True
        if report.get("truncated_bytes") and s.last_exit_ok and not live:
            print(f"rmqstore: {root}: the store was shut down cleanly but its CommitLog's valid data ends at "
                  f"physical offset {report.get('process_offset')}: {report['truncated_bytes']} byte(s) after it "
                  f"do not validate ({report.get('stopped_because')})", file=sys.stderr)
            damaged = True
        if damaged:
            seen = True
            print(f"rmqstore: `rmqstore verify {root}` lists every problem; `rmqstore salvage {root} NEW_DIR` "
                  f"copies every valid message into a new store", file=sys.stderr)
    _opened.clear()
    return seen


def _progress(args, desc: str, unit: str = "B"):
    """A progress bar on stderr (tqdm: done of total, rate, time left):
    ``(update(done, total), close())``; *update* is None (and *close* does
    nothing) when stderr is not a terminal or ``--quiet`` was given."""
    if getattr(args, "quiet", False) or not sys.stderr.isatty():
        return None, lambda: None
    from tqdm import tqdm

    bar = tqdm(desc=desc, total=0, unit=unit, unit_scale=True, file=sys.stderr, leave=False)

    def update(done: int, total: int) -> None:
        bar.total = total
        bar.n = done
        bar.refresh()

    return update, bar.close


def _print_json(obj) -> None:
    line = json.dumps(obj, ensure_ascii=False)
    try:
        sys.stdout.write(line + "\n")
    except UnicodeEncodeError:
        # a lone surrogate (a non-UTF-8 path from argv) or a stdout that is
        # not UTF-8: \u escapes keep the line valid JSON, and lossless
        sys.stdout.write(json.dumps(obj) + "\n")


# --- argument types: a bad value is an argparse error (one line, exit 2) -------


def _int_range(lo: int, hi: int):
    """An argparse type: an integer in [lo, hi]."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise argparse.ArgumentTypeError(f"not an integer: {text!r}") from None
        if not lo <= value <= hi:
            raise argparse.ArgumentTypeError(f"{text!r} is out of range [{lo}, {hi}]")
        return value

    return parse


_count = _int_range(1, MAX_OFFSET)  # a count of 0 asks for nothing: a mistake
_offset = _int_range(0, MAX_OFFSET)  # physical and queue offsets: Java longs, never negative
_queue_id = _int_range(0, INT32_MAX)  # RocketMQ queue ids: Java ints, never negative


def _time(text: str) -> int:
    """An argparse type: ms since epoch from an integer or an ISO-8601 time
    (UTC when no zone), from the epoch to Java's Long.MAX_VALUE."""
    try:
        return time_ms(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _seconds(text: str) -> float:
    """An argparse type: a finite number of seconds, 0 or more."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a number of seconds: {text!r}") from None
    if not (math.isfinite(value) and value >= 0):
        raise argparse.ArgumentTypeError(f"{text!r} is not a finite number of seconds >= 0")
    return value


def _text(what: str):
    """An argparse type: non-empty text with a UTF-8 form (what the store
    writes and compares). Bytes on the command line that are not UTF-8 arrive
    as lone surrogates, which have none."""

    def parse(text: str) -> str:
        if not text:
            raise argparse.ArgumentTypeError(f"the {what} is empty")
        try:
            text.encode("utf-8")
        except UnicodeEncodeError:
            raise argparse.ArgumentTypeError(f"the {what} {text!r} is not valid UTF-8 text") from None
        return text

    return parse


def _msg_id(text: str) -> str:
    """An argparse type: an offset msgId (32 or 56 hex digits, a physical offset >= 0)."""
    try:
        _, offset = decode_offset_msg_id(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"not an offset msgId: {text!r} (32 or 56 hex digits)") from None
    if offset < 0:
        raise argparse.ArgumentTypeError(f"msgId {text!r} holds a negative physical offset ({offset})")
    return text


class BrokerConf(NamedTuple):
    """What ``--broker-conf FILE`` read from a broker's ``broker.conf``."""

    path: str
    config: StoreConfig  # its store settings over a broker's defaults
    root_dir: str | None  # its storePathRootDir; None when it sets none
    commit_log_dir: str | None  # its storePathCommitLog; None when it sets none


def _broker_conf(path: str) -> BrokerConf:
    """An argparse type: a broker's ``broker.conf`` (a Java .properties
    file): its ``storePathRootDir``, ``storePathCommitLog`` and store
    settings, RocketMQ's older spellings too (``mapedFileSizeCommitLog``)."""
    try:
        props = read_properties(path)
        config = StoreConfig.from_dict(props, strict=False, base=StoreConfig.broker_defaults())
    except (OSError, ConfigError, UnicodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot use {path!r}: {e}") from None
    root, cl = props.get("storePathRootDir") or None, props.get("storePathCommitLog") or None
    return BrokerConf(path, config, root and os.path.expanduser(root), cl and os.path.expanduser(cl))


#: where a broker keeps its store when its broker.conf names no storePathRootDir
DEFAULT_STORE_ROOT = os.path.join("~", "store")


def _resolve_store(args) -> None:
    """Set ``args.store`` from ``--broker-conf`` when no STORE was given, and
    refuse a broker.conf whose CommitLog lies outside ``STORE/commitlog``
    (rmqstore keeps every file under one root). UsageError when there is
    neither a STORE nor a broker.conf."""
    conf = getattr(args, "broker_conf", None)
    if args.store is None:
        if conf is None:
            raise UsageError("give the store directory, or --broker-conf FILE (its storePathRootDir)")
        if conf.root_dir is None:
            print(f"rmqstore: {_show(conf.path)} sets no storePathRootDir: reading RocketMQ's default, "
                  f"{DEFAULT_STORE_ROOT}", file=sys.stderr)
        args.store = conf.root_dir or os.path.expanduser(DEFAULT_STORE_ROOT)
    if conf is not None and conf.commit_log_dir is not None:
        want = os.path.join(args.store, "commitlog")
        if os.path.normpath(os.path.abspath(conf.commit_log_dir)) != os.path.normpath(os.path.abspath(want)):
            raise UsageError(f"{_show(conf.path)} keeps the CommitLog at {_show(conf.commit_log_dir)}, not in "
                             f"{_show(want)}: rmqstore reads a store whose files are all under its root "
                             f"(copy or link the CommitLog there)")


def _config_arg(args) -> StoreConfig | None:
    """The store settings of ``--broker-conf`` (read while parsing), or None."""
    conf = getattr(args, "broker_conf", None)
    return None if conf is None else conf.config


# --- store paths ----------------------------------------------------------------

# the entries by which a directory is recognised as a store (as recover_store does)
_STORE_DIRS = ("commitlog", "consumequeue", "index")
_STORE_FILES = ("checkpoint",)


def _store_entries(path) -> list:
    """The store entries found in directory *path*; UsageError when one has the wrong kind."""
    found = []
    for name in _STORE_DIRS + _STORE_FILES:
        p = os.path.join(path, name)
        if not os.path.lexists(p):
            continue
        if (name in _STORE_DIRS) != os.path.isdir(p):
            kind = "a directory" if name in _STORE_DIRS else "a file"
            raise UsageError(f"{_show(path)} is not a store: its {name} is not {kind}")
        found.append(name)
    return found


def _check_store(path) -> None:
    """Refuse a *path* that is not a store directory, before anything opens it:
    the writing commands (recover, clean) must not create a store in a
    mistaken directory, and the read commands would show an empty one."""
    if not os.path.exists(path):
        raise UsageError(f"cannot read the store: no store directory at {_show(path)}")
    if not os.path.isdir(path):
        raise UsageError(f"cannot read the store: {_show(path)} is not a directory")
    try:
        os.listdir(path)
    except OSError as e:  # (unreadable: PermissionError)
        raise UsageError(f"cannot read the store: {e}") from e
    if _store_entries(path):
        return
    inner = os.path.join(path, "store")
    if os.path.isdir(inner) and _store_entries(inner):
        raise UsageError(f"{_show(path)} is not a store, but {_show(inner)} is (a broker keeps its store in store/)")
    raise UsageError(f"{_show(path)} is not a store (no commitlog/, consumequeue/, index/ or checkpoint in it)")


# --- commands -----------------------------------------------------------------


def _file_states(s) -> list:
    """Per CommitLog file, oldest first: ``{"name", "state"}``, the state
    ``ok``, ``damaged at <offset>`` (read around, see the open's report) or
    ``valid data ends at <offset>`` (where the readable records stop)."""
    report = s.recovery_report
    end = report.get("process_offset")
    out = []
    for f in s.commitlog.queue.files:
        lo, hi = f.file_from_offset, f.file_from_offset + f.file_size
        hits = [d["physical_offset"] for d in report.get("damage", ()) if lo <= d["physical_offset"] < hi]
        if hits:
            state = "damaged at " + ", ".join(str(x) for x in hits)
        elif report.get("truncated_bytes") and end is not None and lo <= end < hi:
            state = f"valid data ends at {end}"
        else:
            state = "ok"
        out.append({"name": os.path.basename(f.path), "state": state})
    return out


def _groups(s) -> dict:
    """``{group: [topics]}`` with committed offsets; {} with a warning when
    the offset file does not parse (the rest of ``info`` still stands)."""
    from .exceptions import CorruptedFileError

    try:
        return s.consumer_offsets().group_topic_map()
    except CorruptedFileError as e:
        print(f"rmqstore: warning: consumer offsets not read: {e}", file=sys.stderr)
        return {}


def cmd_info(args) -> int:
    with _open(args) as s:
        cl = s.commitlog
        files = cl.queue.files
        out = {
            "store": s.root_dir,  # (_print_json keeps a non-UTF-8 path lossless)
            "commitlog": {
                "file_size": cl.file_size,
                "files": [os.path.basename(f.path) for f in files],
                "file_states": _file_states(s),
                "min_physical_offset": s.min_physical_offset,
                "max_physical_offset": s.max_physical_offset,
            },
            "index": {
                "hash_slot_num": s.index.hash_slot_num,
                "index_num": s.index.index_num,
                "files": [dict(name=f.name, **f.header()) for f in s.index.files],
            },
            "checkpoint": s.checkpoint.to_dict(),
            "clean_shutdown": s.last_exit_ok,
            "writer_running": StoreLock.is_held(s.root_dir),
            "groups": _groups(s),  # (consumer groups with committed offsets)
            "queues": [],
        }
        for topic, qid in s.queues():
            cq = s.consume_queue(topic, qid)
            mn, mx = cq.min_offset_in_queue(), cq.max_offset_in_queue()
            first = last = None
            if mx > mn:
                u0, u1 = cq.get_unit(mn), cq.get_unit(mx - 1)
                first = cl.store_timestamp_at(u0[0], u0[1]) if u0 else None
                last = cl.store_timestamp_at(u1[0], u1[1]) if u1 else None
            out["queues"].append(
                {
                    "topic": topic, "queue_id": qid, "min_offset": mn, "max_offset": mx,
                    "messages": mx - mn, "first_store_time": _ts(first), "last_store_time": _ts(last),
                }
            )
        if args.json:
            _print_json(out)
            return 0
        shutdown = ("a writer holds it" if out["writer_running"] else
                    "clean shutdown" if s.last_exit_ok else "NOT shut down cleanly")
        print(f"store            {_show(out['store'])}  ({shutdown})")
        print(f"commitlog        {len(files)} file(s) of {cl.file_size} bytes, physical offsets "
              f"[{s.min_physical_offset}, {s.max_physical_offset})")
        for f in out["commitlog"]["file_states"]:
            print(f"  {f['name']}  {f['state']}")
        print(f"index            {len(s.index.files)} file(s), "
              f"{s.index.hash_slot_num} slots x {s.index.index_num} entries")
        for f in out["index"]["files"]:
            print(f"  {f['name']}  keys={f['index_count'] - 1}  phy=[{f['begin_phy_offset']}, {f['end_phy_offset']}]  "
                  f"time=[{_ts(f['begin_timestamp'])}, {_ts(f['end_timestamp'])}]")
        groups = out["groups"]
        print(f"consumer groups  {len(groups)}" + (" (rmqstore consumer-progress STORE: their lag)" if groups else ""))
        for g, topics in groups.items():
            print(f"  {g}: {', '.join(topics)}")
        print(f"queues           {len(out['queues'])}")
        width = max([len(q["topic"]) for q in out["queues"]] + [5])
        for q in out["queues"]:
            print(f"  {q['topic']:<{width}} {q['queue_id']:>3}  offsets [{q['min_offset']}, {q['max_offset']})  "
                  f"{q['messages']:>8} msgs  {q['first_store_time']} .. {q['last_store_time']}")
    return 0


def cmd_consumer_progress(args) -> int:
    """Consumer groups' progress (mqadmin's ``consumerProgress``), from
    ``config/consumerOffset.json`` and the queues."""
    with _open(args) as s:
        rows = consumer_progress(s, args.group)
        for r in rows:
            r["first_unconsumed_store_time"] = _ts(r["first_unconsumed_store_time"])
        if args.group is not None and not rows:
            print(f"rmqstore: no committed offsets for group {args.group!r} in {_show(s.root_dir)}", file=sys.stderr)
            return 1
        if args.json:
            _print_json(rows)
            return 0
        if not rows:
            print("no consumer group has committed an offset")
            return 0
        wg = max(len("GROUP"), *(len(r["group"]) for r in rows))
        wt = max(len("TOPIC"), *(len(r["topic"]) for r in rows))
        print(f"{'GROUP':<{wg}}  {'TOPIC':<{wt}}  {'QUEUE':>5}  {'COMMITTED':>12}  {'MAX':>12}  {'LAG':>10}  "
              f"{'FIRST UNCONSUMED':<29}  LAG TIME")
        for r in rows:
            print(f"{r['group']:<{wg}}  {r['topic']:<{wt}}  {r['queue_id']:>5}  {r['committed_offset']:>12}  "
                  f"{r['max_offset']:>12}  {r['lag']:>10}  {r['first_unconsumed_store_time']:<29}  "
                  f"{r['lag_ms'] / 1000:.1f} s")
        totals: dict = {}
        for r in rows:
            totals[r["group"]] = totals.get(r["group"], 0) + r["lag"]
        for g, lag in totals.items():
            r = next(r for r in rows if r["group"] == g)
            print(f"group {g}: {lag} message(s) behind; {r['retry_messages']} in %RETRY%{g}, "
                  f"{r['dead_letters']} dead letter(s) in %DLQ%{g}")
    return 0


def cmd_dump(args) -> int:
    begin, end = args.begin, args.end
    if begin is not None and end is not None and begin > end:
        raise UsageError(f"--begin ({begin}) is after --end ({end})")
    if args.to_offset is not None and args.from_offset > args.to_offset:
        raise UsageError(f"--from-offset ({args.from_offset}) is past --to-offset ({args.to_offset})")
    n = 0
    with _open(args) as s:
        start = args.from_offset
        if begin is not None:
            start = max(start, _time_seek(s, begin, args.topic, args.queue_id))
        # the first damaged region at or after where the dump starts (the open read around it)
        stop_at = None if args.skip_damaged else next(
            (d for d in s.recovery_report.get("damage", ()) if d["resumes_at"] > start), None)
        # a bar only when the records go elsewhere than the terminal it is drawn on
        update, done = _progress(args, "dump") if not sys.stdout.isatty() else (None, lambda: None)
        total = max(0, (args.to_offset or s.max_physical_offset) - start)
        try:
            for m in s.iter_messages(start):
                if args.to_offset is not None and m.physical_offset >= args.to_offset:
                    break
                if end is not None and m.store_timestamp > end:
                    break  # (store times follow CommitLog order: the rest are later still)
                printed = _dump_one(args, m, stop_at)
                if printed is None:
                    break
                n += printed
                if args.limit is not None and n >= args.limit:
                    break
                if update is not None and not n & 1023:
                    update(min(total, m.physical_offset - start), total)
        finally:
            done()
    return 0


def _dump_one(args, m, stop_at) -> int | None:
    """Print message *m* if the filters keep it: 1 when printed, 0 when
    filtered out, None past the damage where the dump stops (said on stderr)."""
    if stop_at is not None and m.physical_offset >= stop_at["resumes_at"]:
        print(f"rmqstore: dump stopped at the damage at CommitLog physical offset "
              f"{stop_at['physical_offset']}; --skip-damaged reads on from {stop_at['resumes_at']}",
              file=sys.stderr)
        return None
    if args.topic is not None and m.topic != args.topic:
        return 0
    if args.queue_id is not None and m.queue_id != args.queue_id:
        return 0
    if args.begin is not None and m.store_timestamp < args.begin:
        return 0
    _print_json(m.to_dict(body=args.body))
    return 1


def _time_seek(s, begin: int, topic, queue_id) -> int:
    """A CommitLog physical offset before which no record of *topic* (any,
    when None) and *queue_id* has a store time >= *begin* ms: the end of the
    last unit stored before *begin* in each such queue, found by the
    ConsumeQueue time search (getOffsetInQueueByTime), the greatest of them.
    A record before it was stored before that unit, so earlier (store
    times follow CommitLog order, as RocketMQ's time search assumes)."""
    at = 0
    for t, q in s.queues():
        if (topic is not None and t != topic) or (queue_id is not None and q != queue_id):
            continue
        cq = s.consume_queue(t, q)
        off = s.get_offset_in_queue_by_time(t, q, begin, "lower")
        unit = cq.get_unit(off - 1) if cq is not None and off > cq.min_offset_in_queue() else None
        if unit is not None and s.commitlog.store_timestamp_at(unit[0], unit[1]) < begin:
            at = max(at, unit[0] + unit[1])
    return at


def cmd_query_key(args) -> int:
    begin = 0 if args.begin is None else args.begin
    end = MAX_OFFSET if args.end is None else args.end
    if begin > end:
        raise UsageError(f"--begin ({begin}) is after --end ({end})")
    with _open(args) as s:
        if args.offsets_only:
            _print_json(s.query_offsets(args.topic, args.key, args.limit, begin, end))
            return 0
        msgs = s.query_messages(args.topic, args.key, args.limit, begin, end)
        for m in msgs:
            _print_json(m.to_dict(body=args.body))
        return 0 if msgs else 1


def cmd_query_msgid(args) -> int:
    with _open(args) as s:
        m = s.look_message_by_msg_id(args.msg_id)
        if m is None:
            print(f"no message with msgId {args.msg_id}", file=sys.stderr)
            return 1
        _print_json(m.to_dict(body=args.body))
    return 0


def cmd_print_queue(args) -> int:
    with _open(args) as s:
        cq = s.consume_queue(args.topic, args.queue_id)
        if cq is None:
            print(f"no ConsumeQueue for {args.topic}/{args.queue_id}", file=sys.stderr)
            return 1
        q = max(args.start, cq.min_offset_in_queue())
        mx = cq.max_offset_in_queue()
        printed = 0
        while q < mx and (args.limit is None or printed < args.limit):
            units = cq.get_units(q, 1024)
            if not units:
                break
            for phy, size, tags in units:
                _print_json({"queue_offset": q, "physical_offset": phy, "size": size, "tags_code": tags})
                q += 1
                printed += 1
                if args.limit is not None and printed >= args.limit:
                    break
    return 0


def cmd_offset_for_time(args) -> int:
    with _open(args) as s:
        ts = args.timestamp
        off = s.get_offset_in_queue_by_time(args.topic, args.queue_id, ts, args.boundary)
        _print_json({"topic": args.topic, "queue_id": args.queue_id, "timestamp": ts,
                     "boundary": args.boundary, "queue_offset": off})
    return 0


def cmd_verify(args) -> int:
    from .tools import verify_store

    config = _config_arg(args)
    update, done = _progress(args, "verify")
    try:
        problems = verify_store(args.store, config=config, progress=update)
    except OSError as e:
        raise UsageError(f"cannot read the store: {e}") from e
    finally:
        done()
    errors = sum(1 for p in problems if p.severity == "error")
    warnings = len(problems) - errors
    if args.json:
        _print_json([p._asdict() for p in problems])
    else:
        for p in problems:
            print(str(p))
        if problems:
            print(f"{_show(args.store)}: {errors} error(s), {warnings} warning(s)")
        else:
            print(f"{_show(args.store)}: OK, no problems found")
    if errors or (args.strict and warnings):
        return 1
    return 0


def cmd_salvage(args) -> int:
    from .tools import salvage_store

    scan, scan_done = _progress(args, "salvage: scan")
    copy, copy_done = _progress(args, "salvage: copy", unit="msg")

    def progress(stage: str, done: int, total: int) -> None:
        if stage == "scan" and scan is not None:
            scan(done, total)
        elif stage == "copy" and copy is not None:
            scan_done()
            copy(done, total)

    try:
        report = salvage_store(args.store, args.out, config=_config_arg(args), progress=progress)
    except (OSError, ValueError) as e:  # (ValueError: the output inside the source)
        raise UsageError(str(e)) from e
    finally:
        scan_done()
        copy_done()
    _print_json(report)
    lost = bool(report["bad_regions"] or report["not_copied"])
    print(f"salvaged {report['messages_copied']} of {report['records_found']} valid message(s) "
          f"into {_show(report['output'])}; "
          f"{report['bytes_skipped']} byte(s) skipped in {len(report['bad_regions'])} bad region(s), "
          f"{len(report['not_copied'])} message(s) not copied", file=sys.stderr)
    return 1 if lost else 0


def _confirm(args, question: str) -> bool:
    """Whether to go on with a destructive command: yes with ``--yes`` or
    when stdin is not a terminal (a script); else the answer to *question*."""
    if args.yes or not sys.stdin.isatty():
        return True
    print(f"{question} [y/N] ", end="", file=sys.stderr, flush=True)
    return sys.stdin.readline().strip().lower() in ("y", "yes")


def _recovery_sentence(report: dict, would: bool) -> str:
    kind = ("normal recovery" if report.get("last_exit_ok")
            else "abnormal recovery (the store was not shut down cleanly)")
    why = report.get("stopped_because")
    cut, dropped = ("would truncate", "would be dropped") if would else ("truncated", "dropped")
    return (f"{kind} of {_show(report['store'])}: valid data ends at physical offset {report.get('process_offset')}; "
            f"{cut} {report.get('truncated_bytes', 0)} byte(s)" + (f" because: {why}" if why else "")
            + f"; {report['consume_queue_units_dropped']} ConsumeQueue unit(s) {dropped}")


def cmd_recover(args) -> int:
    from .exceptions import StoreLockedError
    from .tools import recover_store

    config = _config_arg(args)
    if args.dry_run or (not args.yes and sys.stdin.isatty()):
        update, done = _progress(args, "recover (dry run)")
        try:
            plan = recover_store(args.store, config=config, dry_run=True, progress=update)
        finally:
            done()
        if args.dry_run:
            _print_json(plan)
            print(_recovery_sentence(plan, would=True) + "; nothing was changed", file=sys.stderr)
            if plan["writer_running"]:
                print("rmqstore: a writer holds the store: recover would refuse", file=sys.stderr)
            if plan.get("would_refuse"):
                print(f"rmqstore: {plan['would_refuse']}", file=sys.stderr)
            return 0
        print(_recovery_sentence(plan, would=True), file=sys.stderr)
        if not _confirm(args, "recover now?"):
            print("rmqstore: nothing was changed", file=sys.stderr)
            return 1
    update, done = _progress(args, "recover")
    try:
        report = recover_store(args.store, config=config, progress=update)
    except StoreLockedError as e:
        raise UsageError(f"refusing to recover: {e} (stop the writer first)") from e
    finally:
        done()
    _print_json(report)
    print(_recovery_sentence(report, would=False), file=sys.stderr)
    return 0


def cmd_clean(args) -> int:
    """One clean-up round now (``MessageStore.delete_expired``); needs the
    writer's lock, so it refuses while a writer runs."""
    from .exceptions import StoreLockedError

    config = _config_arg(args) or StoreConfig()
    # the files say how big they are: a store written with other sizes opens too
    with MessageStore.open(args.store, config=config, read_only=True) as ro:
        plan = None
        if args.dry_run or (not args.yes and sys.stdin.isatty()):
            plan = ro.delete_expired(force=args.force, reserved_hours=args.reserved_hours, dry_run=True)
        sizes = {}
        if ro.commitlog.queue.files:
            sizes["mapped_file_size_commit_log"] = ro.commitlog.file_size
        cq_sizes = {cq.file_size for cq in (ro.consume_queue(t, q) for t, q in ro.queues()) if cq and cq.queue.files}
        if len(cq_sizes) == 1:
            sizes["mapped_file_size_consume_queue"] = cq_sizes.pop()
        if ro.index.files:
            sizes["max_hash_slot_num"], sizes["max_index_num"] = ro.index.hash_slot_num, ro.index.index_num
    if plan is not None:
        if args.dry_run:
            return _print_cleanup(args, plan, would=True)
        _print_cleanup(args, plan, would=True, out=sys.stderr)
        if not _confirm(args, "delete these files now?"):
            print("rmqstore: nothing was changed", file=sys.stderr)
            return 1
    # (a maintenance open: no clean-up round of its own, no delayed delivery)
    config = config.replace(clean_service_enable=False, schedule_service_enable=False, **sizes)
    try:
        store = MessageStore.open(args.store, config=config)
    except StoreLockedError as e:
        raise UsageError(f"{e} (a running writer cleans its own store)") from e
    update, done = _progress(args, "clean")
    try:
        with store:
            report = store.delete_expired(force=args.force, reserved_hours=args.reserved_hours, progress=update)
    finally:
        done()
    return _print_cleanup(args, report, would=False)


def _print_cleanup(args, report, would: bool, out=None) -> int:
    """A clean-up report (or, *would*, a dry run's) as JSON with ``--json``
    (on stdout only), else as lines."""
    data = report._asdict()
    data["deleted"] = report.deleted
    if would:
        data["dry_run"] = True
    if args.json and out is None:
        _print_json(data)
        return 0
    verb = "would delete" if would else "deleted"
    for key, label in (("commit_log_files", "CommitLog"), ("consume_queue_files", "ConsumeQueue"),
                       ("index_files", "index")):
        for path in data[key]:
            print(f"{verb} {label:<12} {_show(path)}", file=out)
    print(f"{_show(args.store)}: {verb} {report.deleted} CommitLog, "
          f"{len(report.consume_queue_files)} ConsumeQueue and "
          f"{len(report.index_files)} index file(s); CommitLog "
          f"{'would start' if would else 'now starts'} at physical offset {report.min_physical_offset}"
          + ("; readers held a file, run again later" if report.busy else "")
          + ("; nothing was changed" if would else ""), file=out)
    return 0


def cmd_tail(args) -> int:
    """Print messages of a topic as a writer process stores them (read-only
    follow mode), as JSON lines, until --limit messages, --timeout seconds or
    Ctrl-C."""
    printed = 0
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    pause = max(args.interval, 1) / 1000
    try:
        with _open(args) as s:
            offsets: dict = {}

            def add_queues(initial: bool) -> None:
                qids = [args.queue_id] if args.queue_id is not None else [q for t, q in s.queues() if t == args.topic]
                for q in qids:
                    if q not in offsets:
                        # queues there at the start: from their end (or the
                        # beginning); queues created later: all of it is new
                        tail_only = initial and not args.from_beginning
                        if initial and args.since is not None:
                            offsets[q] = s.get_offset_in_queue_by_time(args.topic, q, args.since, "lower")
                        else:
                            offsets[q] = (s.get_max_offset_in_queue if tail_only else s.get_min_offset_in_queue)(
                                args.topic, q
                            )

            add_queues(True)
            while True:
                got = 0
                for q in sorted(offsets):
                    r = s.get_messages(args.topic, q, offsets[q], 32)
                    offsets[q] = r.next_begin_offset
                    for m in r.messages:
                        _print_json(m.to_dict(body=args.body))
                        printed += 1
                        got += 1
                        if args.limit is not None and printed >= args.limit:
                            sys.stdout.flush()
                            return 0
                sys.stdout.flush()
                if deadline is not None and time.monotonic() >= deadline:
                    return 0
                if not got:
                    time.sleep(pause)
                    if args.queue_id is None:
                        s.refresh()  # queues the writer created since
                        add_queues(False)
    except KeyboardInterrupt:
        sys.stdout.flush()
        return 0


# --- parser -------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake as one line (no usage block): main()
    prints it and returns 2. Subparsers are of this class too. ``commands``:
    the command parsers by name (on the top-level parser)."""

    commands: dict

    def __init__(self, *args, **kwargs):
        self.arguments: list = []  # every argument's Action, in order (docs/cli.md is made from them)
        super().__init__(*args, **kwargs)

    def add_argument(self, *args, **kwargs):
        action = super().add_argument(*args, **kwargs)
        self.arguments.append(action)
        return action

    def error(self, message):
        raise UsageError(message, prog=self.prog)


#: exit statuses of every command (docs/cli.md#exit-status)
EXIT_OK = 0
EXIT_NOT_FOUND = 1  # nothing found, problems found (verify), lost data (salvage), a declined confirmation
EXIT_USAGE = 2  # a mistake in the arguments, or a path that is no store

# Examples per command, run against a copy of a golden store by the tests
# (tests/test_cli_docs.py) and shown in --help and docs/cli.md. STORE, NEW_STORE
# and DIR stand for paths.
EXAMPLES = {
    "info": ["rmqstore info STORE", "rmqstore info --broker-conf broker.conf --json"],
    "consumer-progress": ["rmqstore consumer-progress STORE", "rmqstore consumer-progress STORE cg_basic --json"],
    "dump": ["rmqstore dump STORE --topic TopicTest --queue-id 0 --limit 10",
             "rmqstore dump STORE --begin 2024-09-19T08:00:00 --body none --skip-damaged"],
    "query-key": ["rmqstore query-key STORE TopicTest order-1001 --limit 5"],
    "query-msgid": ["rmqstore query-msgid STORE C0A8016400002A9F0000000000000000"],
    "print-queue": ["rmqstore print-queue STORE TopicTest 0 --start 10 --limit 3"],
    "offset-for-time": ["rmqstore offset-for-time STORE TopicTest 0 2024-09-19T08:00:00 --boundary upper"],
    "verify": ["rmqstore verify STORE", "rmqstore verify STORE --json --quiet"],
    "salvage": ["rmqstore salvage STORE NEW_STORE"],
    "recover": ["rmqstore recover STORE --dry-run", "rmqstore recover STORE --yes"],
    "clean": ["rmqstore clean STORE --dry-run --json", "rmqstore clean STORE --reserved-hours 0 --yes"],
    "tail": ["rmqstore tail STORE --topic TopicTest --from-beginning --limit 5 --timeout 1",
             "rmqstore tail STORE --topic TopicTest --since 2024-09-19T08:00:01 --limit 5 --timeout 1"],
    "report": ["rmqstore report STORE -o report.html"],
    "completion": ["rmqstore completion bash"],
    "demo": ["rmqstore demo --dir DIR --count 1000"],
}

_HELP_JSON_LINES = "JSON lines on stdout (one object per line): this command's only output, so scripts may give it"


# shtab's completion hints (shtab.DIRECTORY, shtab.FILE), as the plain dicts
# they are: importing shtab costs ~0.1 s, paid only by `rmqstore completion`
# (tests/test_cli_docs.py checks they match)
_COMPLETE_DIR = {"bash": "_shtab_compgen_dirs", "zsh": "_files -/", "tcsh": "d"}
_COMPLETE_FILE = {"bash": "_shtab_compgen_files", "zsh": "_files", "tcsh": "f"}


def _parser() -> _Parser:
    """The parser of every command."""
    from . import demo  # (a module of its own, which imports this one)

    fmt = argparse.RawDescriptionHelpFormatter
    p = _Parser(prog="rmqstore", description="Read and write Apache RocketMQ store directories.",
                epilog="Exit status: 0 done, 1 not found (or problems found), 2 usage, 3 read around damage.",
                formatter_class=fmt)
    p.add_argument("--version", action="version", version=f"rmqstore {__version__} ({IMPLEMENTATION})")
    sub = p.add_subparsers(dest="command", required=True, metavar="COMMAND")
    topic_arg = _text("topic")

    def command(name, help_, description=None):
        epilog = "examples:\n" + "\n".join("  " + e for e in EXAMPLES.get(name, ()))
        return sub.add_parser(name, help=help_, description=description or help_, epilog=epilog,
                              formatter_class=fmt)

    def store_cmd(name, help_, broker_conf_help="a broker's broker.conf: its storePathRootDir is the STORE "
                                                "when none is given, and its store settings apply"):
        sp = command(name, help_)
        sp.add_argument("store", nargs="?", metavar="STORE",
                        help="store root directory, holding commitlog/, consumequeue/, index/ "
                             "(default: --broker-conf's storePathRootDir)").complete = _COMPLETE_DIR
        sp.add_argument("--broker-conf", metavar="FILE", type=_broker_conf,
                        help=broker_conf_help).complete = _COMPLETE_FILE
        # (the name of earlier releases; a broker .properties file is its broker.conf)
        sp.add_argument("--config", dest="broker_conf", type=_broker_conf, help=argparse.SUPPRESS)
        sp.add_argument("--quiet", action="store_true",
                        help="no progress bar on stderr (there is none when stderr is not a terminal)")
        return sp

    def body_opt(sp):
        sp.add_argument("--body", choices=["base64", "text", "hex", "none"], default="text",
                        help="how to print message bodies (default: text)")

    def json_opt(sp, what="print one JSON document on stdout"):
        sp.add_argument("--json", action="store_true", help=what)

    def limit_opt(sp, type_, help_, *old):
        sp.add_argument("--limit", type=type_, metavar="N", help=help_)
        for name in old:  # (earlier releases' names for it)
            sp.add_argument(name, dest="limit", type=type_, help=argparse.SUPPRESS)

    def queue_opt(sp, help_, *old):
        sp.add_argument("--queue-id", type=_queue_id, metavar="ID", help=help_)
        for name in old:
            sp.add_argument(name, dest="queue_id", type=_queue_id, help=argparse.SUPPRESS)

    def time_opts(sp, what):
        sp.add_argument("--begin", type=_time, metavar="TIME",
                        help=f"{what} from this store time on: ms since epoch or ISO-8601 (UTC unless a zone is given)")
        sp.add_argument("--end", type=_time, metavar="TIME", help=f"{what} up to this store time (inclusive)")

    def safety_opts(sp, dry_help):
        sp.add_argument("--dry-run", action="store_true", help=dry_help)
        sp.add_argument("--yes", action="store_true", help="do not ask for confirmation on a terminal")

    sp = store_cmd("info", "files, offset ranges, per topic/queue counts and time spans, consumer groups")
    json_opt(sp)
    sp.set_defaults(func=cmd_info)

    sp = store_cmd("consumer-progress", "each consumer group's committed offset and lag, per topic and queue, "
                                        "and its retry and dead-letter counts (mqadmin consumerProgress)")
    sp.add_argument("group", nargs="?", type=_text("group"), help="one group (default: every group)")
    json_opt(sp, "print one JSON list of rows on stdout")
    sp.set_defaults(func=cmd_consumer_progress)

    sp = store_cmd("dump", "every message as a JSON line, in CommitLog order; stops at damage "
                           "unless --skip-damaged")
    sp.add_argument("--topic", type=topic_arg, help="only this topic's messages")
    queue_opt(sp, "only this queue's messages")
    sp.add_argument("--from-offset", type=_offset, default=0, metavar="OFFSET",
                    help="CommitLog physical offset to start at, a record boundary (default 0)")
    sp.add_argument("--to-offset", type=_offset, metavar="OFFSET", help="stop before this physical offset")
    time_opts(sp, "messages")  # (seek by the ConsumeQueue time search: see _time_seek)
    limit_opt(sp, _count, "print at most N messages (1 or more)")
    sp.add_argument("--skip-damaged", action="store_true",
                    help="read past damaged records to the next valid one (the damage is still reported, exit 3)")
    body_opt(sp)
    json_opt(sp, _HELP_JSON_LINES)
    sp.set_defaults(func=cmd_dump)

    sp = store_cmd("query-key", "messages of a topic by key (UNIQ_KEY or one of KEYS) through the IndexFile, "
                                "newest first")
    sp.add_argument("topic", type=topic_arg, help="the topic")
    sp.add_argument("key", type=_text("key"), help="a UNIQ_KEY or one of a message's KEYS")
    limit_opt(sp, _int_range(1, INT32_MAX), "at most N messages (default 64)", "--max")
    sp.set_defaults(limit=64)
    time_opts(sp, "messages")
    sp.add_argument("--offsets-only", action="store_true",
                    help="print RocketMQ's raw queryOffset answer (hash collisions included, index time in s)")
    body_opt(sp)
    json_opt(sp, _HELP_JSON_LINES)
    sp.set_defaults(func=cmd_query_key)

    sp = store_cmd("query-msgid", "a message by its offset msgId")
    sp.add_argument("msg_id", type=_msg_id, metavar="MSG_ID", help="an offset msgId: 32 or 56 hex digits")
    body_opt(sp)
    json_opt(sp, _HELP_JSON_LINES)
    sp.set_defaults(func=cmd_query_msgid)

    sp = store_cmd("print-queue", "the units of one ConsumeQueue (physical offset, size, tags code)")
    sp.add_argument("topic", type=topic_arg, help="the topic")
    sp.add_argument("queue_id", type=_queue_id, metavar="QUEUE_ID", help="the queue id")
    sp.add_argument("--start", type=_offset, default=0, metavar="OFFSET", help="first queue offset (default 0)")
    limit_opt(sp, _count, "print at most N units (default all)", "--count")
    json_opt(sp, _HELP_JSON_LINES)
    sp.set_defaults(func=cmd_print_queue)

    sp = store_cmd("offset-for-time", "the queue offset for a store time (getOffsetInQueueByTime)")
    sp.add_argument("topic", type=topic_arg, help="the topic")
    sp.add_argument("queue_id", type=_queue_id, metavar="QUEUE_ID", help="the queue id")
    sp.add_argument("timestamp", type=_time, metavar="TIME",
                    help="ms since epoch or ISO-8601 (UTC unless a zone is given)")
    sp.add_argument("--boundary", choices=["lower", "upper"], default="lower",
                    help="the first (lower, default) or last (upper) message at that time")
    json_opt(sp)
    sp.set_defaults(func=cmd_offset_for_time)

    sp = store_cmd("verify", "check every file of a store (read-only); exit 1 when something is wrong",
                   "a broker's broker.conf (delay levels, maxMessageSize; STORE as for every command)")
    json_opt(sp, "print the problems as one JSON list on stdout")
    sp.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    sp.set_defaults(func=cmd_verify)

    sp = store_cmd("salvage", "copy every verifiable message into a new store (the source is only read); "
                              "prints its report as JSON")
    sp.add_argument("out", metavar="NEW_STORE",
                    help="new store directory (must not exist or be empty)").complete = _COMPLETE_DIR
    json_opt(sp, "the report is one JSON document on stdout in any case; sentences go to stderr")
    sp.set_defaults(func=cmd_salvage)

    sp = store_cmd("recover", "open the store for writing, which runs recovery; prints what was truncated as JSON")
    safety_opts(sp, "print what recovery would cut; change nothing")
    json_opt(sp, "the report is one JSON document on stdout in any case; sentences go to stderr")
    sp.set_defaults(func=cmd_recover)

    sp = store_cmd("clean", "delete expired files now (RocketMQ's deleteExpiredCommitLog), then print what went",
                   "a broker's broker.conf (fileReservedTime, deleteFileBatchMax, ...; STORE as for every command)")
    sp.add_argument("--force", action="store_true",
                    help="delete every CommitLog file but the current one, whatever its age")
    sp.add_argument("--reserved-hours", type=_int_range(0, MAX_OFFSET // 3_600_000), metavar="HOURS",
                    help="keep files younger than this (default: fileReservedTime, 72)")
    json_opt(sp, "print the report as one JSON object on stdout")
    safety_opts(sp, "print what would be deleted now; delete nothing")
    sp.set_defaults(func=cmd_clean)

    sp = store_cmd("tail", "print a topic's new messages as a writer stores them (read-only, Ctrl-C stops)")
    sp.add_argument("--topic", required=True, type=topic_arg, help="the topic to follow")
    queue_opt(sp, "one queue id (default: every queue of the topic, new ones too)", "--queue")
    sp.add_argument("--from-beginning", action="store_true", help="start at the oldest stored message")
    sp.add_argument("--since", type=_time, metavar="TIME",
                    help="start at the first message stored at or after this time (ms since epoch or ISO-8601), "
                         "found by the ConsumeQueue time search")
    limit_opt(sp, _count, "exit after N messages", "--max")
    sp.add_argument("--timeout", type=_seconds, metavar="SECONDS", help="exit after this many seconds")
    sp.add_argument("--interval", type=_int_range(0, 3_600_000), default=50, metavar="MS",
                    help="ms between polls when idle (default 50)")
    body_opt(sp)
    json_opt(sp, _HELP_JSON_LINES)
    sp.set_defaults(func=cmd_tail)

    sp = store_cmd("report", "a picture of the store: messages and bytes per topic over time, queue sizes, "
                             "consumer lag, files and disk use (needs rmqstore[report])")
    sp.add_argument("-o", "--output", required=True, metavar="FILE",
                    help="the report to write: FILE.html (self-contained) or FILE.png").complete = _COMPLETE_FILE
    json_opt(sp, "print the report's numbers as one JSON document on stdout")
    sp.set_defaults(func=cmd_report)

    sp = command("completion", "print a shell completion script (bash, zsh or tcsh)",
                 "Print a completion script for rmqstore's commands and options. "
                 "bash: `eval \"$(rmqstore completion bash)\"` in ~/.bashrc; zsh: write it as `_rmqstore` "
                 "into a directory of $fpath.")
    sp.add_argument("shell", choices=["bash", "zsh", "tcsh"], help="the shell")
    sp.set_defaults(func=cmd_completion)

    sp = command("demo", "write, consume and query a demo store with default settings",
                 "Writes messages into a store under the current directory with the "
                 "default settings, consumes them, queries by key and time, prints timings. "
                 "It replaces only a store an earlier demo made (marked by a "
                 f"{demo.DEMO_MARKER} file) and refuses any other directory that is not empty.")
    sp.add_argument("--dir", default="rmqstore-demo", metavar="DIR",
                    help="store directory (default ./rmqstore-demo; an earlier demo's store there is replaced)")
    sp.add_argument("--count", type=_int_range(1, demo.DEMO_MAX_COUNT), default=100_000, metavar="N",
                    help=f"messages to write (1 to {demo.DEMO_MAX_COUNT:,}; default 100,000)")
    sp.add_argument("--body-size", type=_int_range(0, StoreConfig().max_message_size), default=256, metavar="BYTES",
                    help="bytes per message body (default 256, at most maxMessageSize)")
    sp.add_argument("--keep", action="store_true", help="append to an earlier demo's store instead of replacing it")
    sp.set_defaults(func=demo.cmd_demo)

    # Spark jobs live in rmqstore.spark (extra rmqstore[spark]), imported only when asked for
    sp = sub.add_parser("spark", help="Spark jobs: rebuild-cq, rebuild-index (needs rmqstore[spark])",
                        description="Run `rmqstore spark -h` for the jobs.", add_help=False)
    sp.add_argument("-h", "--help", action="store_true", help="the jobs and their options")
    sp.add_argument("spark_args", nargs=argparse.REMAINDER, help="a job and its arguments")
    sp.set_defaults(func=_spark)
    p.commands = sub.choices
    return p


_DOC_HEAD = """\
# Command line

<!-- Generated from the parser by `python -m rmqstore.cli --markdown > docs/cli.md`;
tests/test_cli_docs.py checks that it matches. Edit rmqstore/cli.py, not this file. -->

`rmqstore COMMAND ...` (or `python -m rmqstore COMMAND ...`). Read commands open
the store read-only and take no lock: they work on a copy of a broker's store
and beside a running writer. Every example below runs in the tests against a
copy of a store written by Apache RocketMQ.

## Conventions

- `STORE` is the store root (it holds `commitlog/`, `consumequeue/`, `index/`,
  `checkpoint`). `--broker-conf FILE` reads a broker's `broker.conf`: its
  `storePathRootDir` is the STORE when none is given (RocketMQ's default
  `~/store` when it names none) and its store settings apply, under their
  current or older names (`mappedFileSizeCommitLog` or `mapedFileSizeCommitLog`).
  A `storePathCommitLog` outside `STORE/commitlog` is refused.
- The same names everywhere: `--topic`, `--queue-id`, `--limit N`,
  `--begin`/`--end` (inclusive store times), `--body`, `--json`, `--quiet`,
  `--dry-run`, `--yes`. Earlier names (`--queue`, `--max`, `--count`,
  `--config`) are still accepted.
- Times: ms since epoch or ISO-8601 (UTC unless a zone is given). A number
  between 10^9 and 10^11 is refused with a hint: it is seconds, given by
  mistake.
- Output: stdout carries only data (tables, or with `--json` pure JSON: one
  document, or JSON lines for the commands that print records); notices,
  progress and sentences go to stderr. Progress bars appear only when stderr
  is a terminal, never with `--quiet`.
- Destructive commands (`recover`, `clean`) have `--dry-run` and ask on a
  terminal unless `--yes` is given.

## Exit status

| status | meaning |
|---|---|
| 0 | done; found |
| 1 | not found (a key, a msgId, a queue, a group); problems found (`verify`); messages lost \
(`salvage`); a confirmation declined |
| 2 | usage: a mistake in the arguments, or a path that is not a store (one line on stderr) |
| 3 | a read command read around damage (where, on stderr, with what to run next) |

## Shell completion

`rmqstore completion bash` (or `zsh`, `tcsh`) prints a completion script:
`eval "$(rmqstore completion bash)"` in `~/.bashrc`, or for zsh save it as
`_rmqstore` in a directory of `$fpath`.
"""


def _md_argument(a: argparse.Action) -> tuple:
    """(the argument as typed, what it means) for one row of docs/cli.md."""
    value = a.metavar or (("{" + ",".join(a.choices) + "}") if a.choices else a.dest.upper())
    if not a.option_strings:
        shown = f"[{value}]" if a.nargs == "?" else value
    elif a.nargs == 0:  # a flag
        shown = ", ".join(a.option_strings)
    else:
        shown = ", ".join(f"{o} {value}" for o in a.option_strings)
    meaning = a.help or ""
    if a.required and a.option_strings:
        meaning += " (required)"
    return f"`{shown}`", meaning.replace("|", "\\|")


def cli_markdown() -> str:
    """docs/cli.md: the conventions, exit statuses, and per command its
    description, arguments and examples, made from the parser (not from
    argparse's help text, which differs between Python versions)."""
    p = _parser()
    parts = [_DOC_HEAD]
    for name, sp in p.commands.items():
        parts.append(f"\n## rmqstore {name}\n\n{sp.description}\n")
        rows = [_md_argument(a) for a in sp.arguments if a.help is not argparse.SUPPRESS and a.dest != "help"]
        if name == "spark":
            parts.append("\nThe jobs `rebuild-cq` and `rebuild-index` (needs `rmqstore[spark]`) take "
                         "`STORE`, `--broker-conf FILE`, `--master URL` and `--on-corrupt fail|skip|stop`; "
                         "`rmqstore spark -h` lists them.\n")
            continue
        if rows:
            parts.append("\n| argument | meaning |\n|---|---|\n")
            parts.extend(f"| {arg} | {meaning} |\n" for arg, meaning in rows)
        if EXAMPLES.get(name):
            parts.append("\n```sh\n" + "\n".join(EXAMPLES[name]) + "\n```\n")
    return "".join(parts)


def cmd_report(args) -> int:
    """``rmqstore report``: :func:`rmqstore.report.write_report`."""
    try:
        from .report import write_report
    except ImportError as e:
        raise UsageError(f"{e} (pip install 'rmqstore[report]')") from None
    update, done = _progress(args, "report")
    try:
        summary = write_report(args.store, args.output, progress=update)
    except ImportError as e:
        raise UsageError(str(e)) from None
    except ValueError as e:
        raise UsageError(str(e)) from None
    finally:
        done()
    if args.json:
        _print_json(summary)
    else:
        print(f"wrote {_show(summary['output'])}: {len(summary['topics'])} topic(s), "
              f"{len(summary['queues'])} queue(s), {len(summary['groups'])} consumer progress row(s)",
              file=sys.stderr)
    return 0


def cmd_completion(args) -> int:
    """``rmqstore completion SHELL``: the shell's completion script (shtab), made from the parser."""
    import shtab

    sys.stdout.write(shtab.complete(_parser(), shell=args.shell))
    return 0


def _spark(args) -> int:
    """``rmqstore spark ...``: the jobs of rmqstore.spark, which needs the
    ``spark`` extra; without it, one line and exit 2."""
    try:
        from .spark.cli import main as spark_main
    except ImportError as e:
        raise UsageError(str(e)) from None
    return spark_main(["-h"] * args.help + args.spark_args)


# Errors that mean "what the user pointed at or handed in is wrong": a path
# (missing, of the wrong kind, unreadable, too long), a store or config file
# the library refuses (RmqStoreError: corrupt, locked, ...), text that is not
# valid UTF-8. They get one line and exit status 2; any other exception is a
# bug and keeps its traceback.
_USER_ERRORS = (RmqStoreError, UsageError, UnicodeError, FileNotFoundError, FileExistsError,
                NotADirectoryError, IsADirectoryError, PermissionError)
_USER_ERRNOS = frozenset(
    getattr(errno, name) for name in ("ENAMETOOLONG", "ELOOP", "EROFS", "ENOSPC", "EDQUOT") if hasattr(errno, name)
)


def _fail(prog: str, message) -> int:
    """Print ``<prog>: error: <message>`` as exactly one line on stderr; return 2."""
    text = str(message) or type(message).__name__
    # control characters (a newline in a path, say) and lone surrogates escaped: one printable line
    text = "".join(c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text)
    print(f"{prog}: error: {text}", file=sys.stderr)
    return 2


def main(argv=None) -> int:
    """Run ``rmqstore <command> ...`` (*argv* defaults to ``sys.argv[1:]``) and
    return the exit status (docs/cli.md#exit-status): 0 (:data:`EXIT_OK`)
    done, 1 (:data:`EXIT_NOT_FOUND`) for a command's own "not found",
    "problems found" or "declined" answer (see each command), 2
    (:data:`EXIT_USAGE`) for a mistake in the arguments or a path that is
    not a store, reported as one line on stderr, 3 (:data:`EXIT_DAMAGED`)
    when a read command read around damage, which it says on stderr."""
    try:
        args = _parser().parse_args(argv)
    except UsageError as e:
        return _fail(e.prog or "rmqstore", e)
    prog = f"rmqstore {args.command}"
    try:
        if hasattr(args, "store"):
            _resolve_store(args)
            _check_store(args.store)
        _opened.clear()
        code = args.func(args)
        if _damage_seen() and code == 0:
            code = EXIT_DAMAGED
        return code
    except BrokenPipeError:  # `rmqstore dump | head`
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except _USER_ERRORS as e:
        return _fail(prog, e)
    except OSError as e:
        if e.errno not in _USER_ERRNOS:
            raise
        return _fail(prog, e)


if __name__ == "__main__":  # pragma: no cover
    if sys.argv[1:] == ["--markdown"]:  # (docs/cli.md)
        sys.stdout.write(cli_markdown())
        sys.exit(0)
    sys.exit(main())
