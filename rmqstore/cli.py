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

from . import IMPLEMENTATION, __version__
from .config import StoreConfig
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


def _open(path) -> MessageStore:
    store = MessageStore.open(path, read_only=True)
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
        for d in report.get("damage", ()):
            print(f"rmqstore: {root}: damage at CommitLog physical offset {d['physical_offset']} ({d['reason']}); "
                  f"read on from {d['resumes_at']}", file=sys.stderr)
            damaged = True
        if report.get("truncated_bytes") and s.last_exit_ok and not StoreLock.is_held(s.root_dir):
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


def _config_file(path: str) -> StoreConfig:
    """An argparse type: the StoreConfig of a broker .properties file."""
    try:
        return StoreConfig.from_properties(path)
    except (OSError, ConfigError, UnicodeError) as e:
        raise argparse.ArgumentTypeError(f"cannot use {path!r}: {e}") from None


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
    with _open(args.store) as s:
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
        shutdown = "clean shutdown" if s.last_exit_ok else "NOT shut down cleanly"
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
    with _open(args.store) as s:
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
    with _open(args.store) as s:
        for m in s.iter_messages(args.from_offset):
            if args.to_offset is not None and m.physical_offset >= args.to_offset:
                break
            if args.topic is not None and m.topic != args.topic:
                continue
            if args.queue_id is not None and m.queue_id != args.queue_id:
                continue
            if (begin is not None and m.store_timestamp < begin) or (end is not None and m.store_timestamp > end):
                continue
            _print_json(m.to_dict(body=args.body))
            n += 1
            if args.limit is not None and n >= args.limit:
                break
    return 0


def cmd_query_key(args) -> int:
    begin = 0 if args.begin is None else args.begin
    end = MAX_OFFSET if args.end is None else args.end
    if begin > end:
        raise UsageError(f"--begin ({begin}) is after --end ({end})")
    with _open(args.store) as s:
        if args.offsets_only:
            _print_json(s.query_offsets(args.topic, args.key, args.max, begin, end))
            return 0
        msgs = s.query_messages(args.topic, args.key, args.max, begin, end)
        for m in msgs:
            _print_json(m.to_dict(body=args.body))
        return 0 if msgs else 1


def cmd_query_msgid(args) -> int:
    with _open(args.store) as s:
        m = s.look_message_by_msg_id(args.msg_id)
        if m is None:
            print(f"no message with msgId {args.msg_id}", file=sys.stderr)
            return 1
        _print_json(m.to_dict(body=args.body))
    return 0


def cmd_print_queue(args) -> int:
    with _open(args.store) as s:
        cq = s.consume_queue(args.topic, args.queue_id)
        if cq is None:
            print(f"no ConsumeQueue for {args.topic}/{args.queue_id}", file=sys.stderr)
            return 1
        q = max(args.start, cq.min_offset_in_queue())
        mx = cq.max_offset_in_queue()
        printed = 0
        while q < mx and (args.count is None or printed < args.count):
            units = cq.get_units(q, 1024)
            if not units:
                break
            for phy, size, tags in units:
                _print_json({"queue_offset": q, "physical_offset": phy, "size": size, "tags_code": tags})
                q += 1
                printed += 1
                if args.count is not None and printed >= args.count:
                    break
    return 0


def cmd_offset_for_time(args) -> int:
    with _open(args.store) as s:
        ts = args.timestamp
        off = s.get_offset_in_queue_by_time(args.topic, args.queue_id, ts, args.boundary)
        _print_json({"topic": args.topic, "queue_id": args.queue_id, "timestamp": ts,
                     "boundary": args.boundary, "queue_offset": off})
    return 0


def _config_arg(args):
    """The StoreConfig of ``--config broker.properties`` (read while parsing), or None."""
    return getattr(args, "config", None)


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
          f"{len(report['not_copied'])} message(s) not copied")
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
        plan = recover_store(args.store, config=config, dry_run=True)
        if args.dry_run:
            _print_json(plan)
            print(_recovery_sentence(plan, would=True) + "; nothing was changed")
            if plan["writer_running"]:
                print("rmqstore: a writer holds the store: recover would refuse", file=sys.stderr)
            if plan.get("would_refuse"):
                print(f"rmqstore: {plan['would_refuse']}", file=sys.stderr)
            return 0
        print(_recovery_sentence(plan, would=True), file=sys.stderr)
        if not _confirm(args, "recover now?"):
            print("rmqstore: nothing was changed", file=sys.stderr)
            return 1
    try:
        report = recover_store(args.store, config=config)
    except StoreLockedError as e:
        raise UsageError(f"refusing to recover: {e} (stop the writer first)") from e
    _print_json(report)
    print(_recovery_sentence(report, would=False))
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
    with store:
        report = store.delete_expired(force=args.force, reserved_hours=args.reserved_hours)
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
    follow mode), as JSON lines, until --max messages, --timeout seconds or
    Ctrl-C."""
    printed = 0
    deadline = None if args.timeout is None else time.monotonic() + args.timeout
    pause = max(args.interval, 1) / 1000
    try:
        with _open(args.store) as s:
            offsets: dict = {}

            def add_queues(initial: bool) -> None:
                qids = [args.queue] if args.queue is not None else [q for t, q in s.queues() if t == args.topic]
                for q in qids:
                    if q not in offsets:
                        # queues there at the start: from their end (or the
                        # beginning); queues created later: all of it is new
                        tail_only = initial and not args.from_beginning
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
                        if args.max is not None and printed >= args.max:
                            sys.stdout.flush()
                            return 0
                sys.stdout.flush()
                if deadline is not None and time.monotonic() >= deadline:
                    return 0
                if not got:
                    time.sleep(pause)
                    if args.queue is None:
                        s.refresh()  # queues the writer created since
                        add_queues(False)
    except KeyboardInterrupt:
        sys.stdout.flush()
        return 0


# --- parser -------------------------------------------------------------------


class _Parser(argparse.ArgumentParser):
    """argparse that reports a mistake as one line (no usage block): main()
    prints it and returns 2. Subparsers are of this class too."""

    def error(self, message):
        raise UsageError(message, prog=self.prog)


def _parser() -> argparse.ArgumentParser:
    from . import demo  # (a module of its own, which imports this one)

    p = _Parser(prog="rmqstore", description="Read and write Apache RocketMQ store directories.")
    p.add_argument("--version", action="version", version=f"rmqstore {__version__} ({IMPLEMENTATION})")
    sub = p.add_subparsers(dest="command", required=True)
    topic_arg = _text("topic")

    def store_cmd(name, help_):
        sp = sub.add_parser(name, help=help_, description=help_)
        sp.add_argument("store", help="store root directory (holds commitlog/, consumequeue/, index/)")
        return sp

    def body_opt(sp):
        sp.add_argument("--body", choices=["base64", "text", "hex", "none"], default="text",
                        help="how to print message bodies (default: text)")

    def config_opt(sp, help_):
        sp.add_argument("--config", type=_config_file, help=help_)

    sp = store_cmd("info", "files, offset ranges, per topic/queue counts and time spans")
    sp.add_argument("--json", action="store_true", help="print one JSON object")
    sp.set_defaults(func=cmd_info)

    sp = store_cmd("consumer-progress", "each consumer group's committed offset and lag, per topic and queue, "
                                        "and its retry and dead-letter counts")
    sp.add_argument("group", nargs="?", type=_text("group"), help="one group (default: every group)")
    sp.add_argument("--json", action="store_true", help="print one JSON list of rows")
    sp.set_defaults(func=cmd_consumer_progress)

    sp = store_cmd("dump", "every message as a JSON line, in CommitLog order")
    sp.add_argument("--topic", type=topic_arg)
    sp.add_argument("--queue-id", type=_queue_id)
    sp.add_argument("--from-offset", type=_offset, default=0, help="physical offset to start at (a record boundary)")
    sp.add_argument("--to-offset", type=_offset, help="stop before this physical offset")
    sp.add_argument("--begin", type=_time, help="store time lower bound (ms since epoch or ISO-8601)")
    sp.add_argument("--end", type=_time, help="store time upper bound (ms since epoch or ISO-8601)")
    sp.add_argument("--limit", type=_count, help="print at most this many messages (1 or more)")
    body_opt(sp)
    sp.set_defaults(func=cmd_dump)

    sp = store_cmd("query-key", "messages by key (UNIQ_KEY or KEYS) through the IndexFile")
    sp.add_argument("topic", type=topic_arg)
    sp.add_argument("key", type=_text("key"))
    sp.add_argument("--max", type=_int_range(1, INT32_MAX), default=64)
    sp.add_argument("--begin", type=_time, help="ms since epoch or ISO-8601")
    sp.add_argument("--end", type=_time, help="ms since epoch or ISO-8601")
    sp.add_argument("--offsets-only", action="store_true", help="print RocketMQ's raw queryOffset answer")
    body_opt(sp)
    sp.set_defaults(func=cmd_query_key)

    sp = store_cmd("query-msgid", "a message by its offset msgId")
    sp.add_argument("msg_id", type=_msg_id)
    body_opt(sp)
    sp.set_defaults(func=cmd_query_msgid)

    sp = store_cmd("print-queue", "the units of one ConsumeQueue")
    sp.add_argument("topic", type=topic_arg)
    sp.add_argument("queue_id", type=_queue_id)
    sp.add_argument("--start", type=_offset, default=0, help="first queue offset")
    sp.add_argument("--count", type=_count, help="units to print (default all)")
    sp.set_defaults(func=cmd_print_queue)

    sp = store_cmd("offset-for-time", "queue offset for a store time (getOffsetInQueueByTime)")
    sp.add_argument("topic", type=topic_arg)
    sp.add_argument("queue_id", type=_queue_id)
    sp.add_argument("timestamp", type=_time, help="ms since epoch or ISO-8601 (UTC unless a zone is given)")
    sp.add_argument("--boundary", choices=["lower", "upper"], default="lower")
    sp.set_defaults(func=cmd_offset_for_time)

    sp = store_cmd("verify", "check every file of a store (read-only); non-zero exit when something is wrong")
    sp.add_argument("--json", action="store_true", help="print the problems as one JSON list")
    sp.add_argument("--strict", action="store_true", help="exit 1 on warnings too")
    sp.add_argument("--quiet", action="store_true", help="no progress bar (none when stderr is not a terminal)")
    config_opt(sp, "broker .properties file (delay levels, maxMessageSize)")
    sp.set_defaults(func=cmd_verify)

    sp = store_cmd("salvage", "copy every verifiable message into a new store (the source is only read)")
    sp.add_argument("out", help="new store directory (must not exist or be empty)")
    sp.add_argument("--quiet", action="store_true", help="no progress bar (none when stderr is not a terminal)")
    config_opt(sp, "broker .properties file for settings not inferred from the files")
    sp.set_defaults(func=cmd_salvage)

    sp = store_cmd("recover", "open the store for writing, which runs recovery, and report what was truncated")
    config_opt(sp, "broker .properties file for settings not inferred from the files")
    sp.add_argument("--dry-run", action="store_true", help="print what recovery would cut; change nothing")
    sp.add_argument("--yes", action="store_true", help="do not ask for confirmation on a terminal")
    sp.set_defaults(func=cmd_recover)

    sp = store_cmd("clean", "delete expired files now (RocketMQ's deleteExpiredCommitLog), then print what went")
    sp.add_argument("--force", action="store_true",
                    help="delete every CommitLog file but the current one, whatever its age")
    sp.add_argument("--reserved-hours", type=_int_range(0, MAX_OFFSET // 3_600_000),
                    help="keep files younger than this (default: fileReservedTime, 72)")
    config_opt(sp, "broker .properties file (fileReservedTime, deleteFileBatchMax, ...)")
    sp.add_argument("--json", action="store_true", help="print the report as one JSON object")
    sp.add_argument("--dry-run", action="store_true", help="print what would be deleted now; delete nothing")
    sp.add_argument("--yes", action="store_true", help="do not ask for confirmation on a terminal")
    sp.set_defaults(func=cmd_clean)

    sp = store_cmd("tail", "print a topic's new messages as a writer stores them (read-only, Ctrl-C stops)")
    sp.add_argument("--topic", required=True, type=topic_arg)
    sp.add_argument("--queue", type=_queue_id, help="one queue id (default: every queue of the topic, new ones too)")
    sp.add_argument("--from-beginning", action="store_true", help="start at the oldest stored message")
    sp.add_argument("--max", type=_count, help="exit after this many messages")
    sp.add_argument("--timeout", type=_seconds, help="exit after this many seconds")
    sp.add_argument("--interval", type=_int_range(0, 3_600_000), default=50,
                    help="ms between polls when idle (default 50)")
    body_opt(sp)
    sp.set_defaults(func=cmd_tail)

    sp = sub.add_parser("demo", help="write, consume and query a demo store with default settings",
                        description="Writes messages into a store under the current directory with the "
                                    "default settings, consumes them, queries by key and time, prints timings. "
                                    "It replaces only a store an earlier demo made (marked by a "
                                    f"{demo.DEMO_MARKER} file) and refuses any other directory that is not empty.")
    sp.add_argument("--dir", default="rmqstore-demo",
                    help="store directory (default ./rmqstore-demo; an earlier demo's store there is replaced)")
    sp.add_argument("--count", type=_int_range(1, demo.DEMO_MAX_COUNT), default=100_000,
                    help=f"messages to write (1 to {demo.DEMO_MAX_COUNT:,}; default 100,000)")
    sp.add_argument("--body-size", type=_int_range(0, StoreConfig().max_message_size), default=256,
                    help="bytes per message body (default 256, at most maxMessageSize)")
    sp.add_argument("--keep", action="store_true", help="append to an earlier demo's store instead of replacing it")
    sp.set_defaults(func=demo.cmd_demo)

    # Spark jobs live in rmqstore.spark (extra rmqstore[spark]), imported only when asked for
    sp = sub.add_parser("spark", help="Spark jobs: rebuild-cq, rebuild-index (needs rmqstore[spark])",
                        description="Run `rmqstore spark -h` for the jobs.", add_help=False)
    sp.add_argument("-h", "--help", action="store_true")
    sp.add_argument("spark_args", nargs=argparse.REMAINDER)
    sp.set_defaults(func=_spark)
    return p


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
    return the exit status: 0 done, 1 for a command's own "not found" or
    "damaged" answer (see each command), 2 for a mistake in the arguments or
    a path that is not a store, reported as one line on stderr, 3
    (:data:`EXIT_DAMAGED`) when a read command read around damage, which it
    says on stderr."""
    try:
        args = _parser().parse_args(argv)
    except UsageError as e:
        return _fail(e.prog or "rmqstore", e)
    prog = f"rmqstore {args.command}"
    try:
        if getattr(args, "store", None) is not None:
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
    sys.exit(main())
