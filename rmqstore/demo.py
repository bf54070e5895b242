"""``rmqstore demo``: write, consume and query a store with default
settings, timing each step (the README's first command). The directory it
writes is marked as the demo's, and a later run replaces only such a
directory."""

from __future__ import annotations

import os
import shlex
import shutil
import stat
import sys
import time

from . import IMPLEMENTATION, __version__
from .cli import UsageError, _show
from .message import Message
from .store import MessageStore, StoreLock

# The demo marks the directory it makes with this file, and later runs replace
# only such a directory: never a store (or anything else) it did not make.
DEMO_MARKER = ".rmqstore-demo"
DEMO_MAX_COUNT = 10_000_000  # (the demo builds its messages in memory first)
_DEMO_DIRS = frozenset({"commitlog", "consumequeue", "index"})
_DEMO_FILES = frozenset({DEMO_MARKER, "checkpoint", "abort", "lock"})


def _not_demo_made(path):
    """Why directory *path* is not a store an earlier demo made, or None when
    it is: the marker file, and only the entries a store has, each of its
    kind (no symlinks)."""
    names = sorted(os.listdir(path))
    if DEMO_MARKER not in names:
        return f"no {DEMO_MARKER} file marks it as the demo's"
    for name in names:
        mode = os.lstat(os.path.join(path, name)).st_mode
        if not ((name in _DEMO_DIRS and stat.S_ISDIR(mode)) or (name in _DEMO_FILES and stat.S_ISREG(mode))):
            return f"it holds {name!r}, which the demo does not write"
    return None


def _demo_dir(path, keep: bool) -> None:
    """Make *path* ready for the demo: a new or empty directory is marked as
    the demo's; an earlier demo's store is emptied (unless *keep*). Anything
    else refuses (UsageError) before a byte is written or deleted."""
    if os.path.lexists(path) and not os.path.isdir(path):
        raise UsageError(f"{_show(path)} exists and is not a directory")
    os.makedirs(path, exist_ok=True)
    marker = os.path.join(path, DEMO_MARKER)
    if not os.listdir(path):
        with open(marker, "w") as fh:
            fh.write("a store written by `rmqstore demo`, which replaces it on its next run\n")
        return
    why = _not_demo_made(path)
    if why:
        raise UsageError(f"refusing to write into {_show(path)}: it is not empty and not an earlier demo's store "
                         f"({why}); pass another --dir")
    if keep:
        return
    with StoreLock(path):  # (StoreLockedError: a demo is running there)
        for name in os.listdir(path):
            if name in _DEMO_DIRS:
                shutil.rmtree(os.path.join(path, name))
            elif name not in (DEMO_MARKER, "lock"):  # (the lock file is held: the new store takes it over)
                os.remove(os.path.join(path, name))


def cmd_demo(args) -> int:
    """Write, consume and query a store with default settings, timing each step."""
    path = os.path.abspath(args.dir)
    _demo_dir(path, args.keep)
    n, queues, topic = args.count, 8, "DemoTopic"
    body = bytes(range(256)) * (args.body_size // 256) + bytes(args.body_size % 256)
    print(f"rmqstore {__version__} ({IMPLEMENTATION} core): demo store at {_show(path)}")
    with MessageStore.open(path) as s:
        # where this run's messages start: with --keep, an earlier run's come first
        start = [s.get_max_offset_in_queue(topic, q) for q in range(queues)]
        msgs = [
            Message(topic, body, queue_id=i % queues, tags=f"Tag{i % 4}", keys=f"order-{i}")
            for i in range(n)
        ]
        t0 = time.perf_counter()
        results = s.put_messages(msgs[: n // 2])
        for m in msgs[n // 2 :]:
            results.append(s.put_message(m))
        t_put = time.perf_counter() - t0
        print(f"put      {n:>9,} messages of {len(body)} B in {t_put:.2f} s  "
              f"({n / t_put:,.0f} msg/s; half batched, half one call each)")
        t0 = time.perf_counter()
        s.flush()  # on disk before the reads, which the write-back would slow down
        print(f"flush    {s.max_physical_offset:>9,} bytes to disk in {time.perf_counter() - t0:.2f} s")

        def drain(pull, count) -> int:
            """This run's messages, pulled 32 at a time from every queue."""
            got = 0
            for q in range(queues):
                off = start[q]
                while True:
                    r = pull(topic, q, off, 32)
                    if not count(r):
                        break
                    got += count(r)
                    off = r.next_begin_offset
            return got

        t0 = time.perf_counter()
        got = drain(s.get_messages, lambda r: len(r.messages))
        t_get = time.perf_counter() - t0
        print(f"consume  {got:>9,} messages from {queues} queues in {t_get:.2f} s  ({got / t_get:,.0f} msg/s)")
        if got != n:
            print(f"ERROR: consumed {got} of {n} messages", file=sys.stderr)
            return 1
        first = s.get_message_views(topic, 0, start[0], 1)  # (outside the timing: its first call imports numpy)
        t0 = time.perf_counter()
        got = drain(s.get_message_views, lambda r: len(r.units))
        t_view = time.perf_counter() - t0
        print(f"views    {got:>9,} messages zero-copy (get_message_views) in {t_view:.2f} s  "
              f"({got / t_view:,.0f} msg/s)")
        if got != n or bytes(first.bodies()[0]) != body:
            print(f"ERROR: zero-copy consumed {got} of {n} messages", file=sys.stderr)
            return 1
        k = min(n, 10_000)
        t0 = time.perf_counter()
        for i in range(0, n, max(1, n // k)):
            found = [m.physical_offset for m in s.query_messages(topic, f"order-{i}")]
            # (with --keep, earlier runs' messages carry the same keys)
            if results[i].wrote_offset not in found or (len(found) != 1 and not args.keep):
                print(f"ERROR: key order-{i} not found", file=sys.stderr)
                return 1
        t_key = time.perf_counter() - t0
        print(f"key      {k:>9,} lookups (query_messages) in {t_key:.2f} s  ({k / t_key:,.0f} lookups/s)")
        t0 = time.perf_counter()
        for i in range(0, n, max(1, n // k)):
            r = results[i]
            off = s.get_offset_in_queue_by_time(topic, i % queues, r.store_timestamp)
            if off > r.queue_offset:
                print(f"ERROR: time lookup for message {i} returned {off}", file=sys.stderr)
                return 1
        t_time = time.perf_counter() - t0
        print(f"time     {k:>9,} lookups (get_offset_in_queue_by_time) in {t_time:.2f} s  "
              f"({k / t_time:,.0f} lookups/s)")
        print(f"store    physical offsets [{s.min_physical_offset}, {s.max_physical_offset}), "
              f"{len(s.commitlog.queue.files)} CommitLog file(s), {len(s.index.files)} index file(s)")
    print(f"done. Inspect it with: rmqstore info {shlex.quote(_show(args.dir))}")
    return 0
