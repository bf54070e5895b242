"""Delayed delivery's throughput (not a pytest suite; run it as a script).

Puts ``--messages`` 256-byte messages over 8 queues, in batches of 1,000,
as plain messages and as delayed ones (``delay_level=1``: stored in
SCHEDULE_TOPIC_XXXX), then advances the store's clock past their time and
times the schedule service's delivery of all of them (one
``deliver_due()``: read each due record, store it again in its topic,
write ``config/delayOffset.json``). Each phase builds its messages inside
the timing, as a caller's code does.

    python bench/schedule.py                       # 200k messages
    python bench/schedule.py --messages 1000000
    RMQSTORE_PURE_PYTHON=1 python bench/schedule.py --messages 50000
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore._kernels import IMPLEMENTATION

QUEUES = 8
BODY = bytes(range(256))
T0 = 1_700_000_000_000


class Clock:
    """The store's clock, moved by the benchmark (the delay needs no waiting)."""

    def __init__(self):
        self.now = T0

    def __call__(self) -> int:
        return self.now


def put_all(store, n: int, delayed: bool) -> float:
    kw = {"delay_level": 1} if delayed else {}
    t0 = time.perf_counter()
    for start in range(0, n, 1000):
        store.put_messages([Message("D", BODY, queue_id=i % QUEUES, **kw) for i in range(start, min(n, start + 1000))])
    return time.perf_counter() - t0


def run(root: str, n: int) -> dict:
    clock = Clock()
    with MessageStore.open(os.path.join(root, "plain"), StoreConfig(), clock=clock) as s:
        plain = put_all(s, n, False)
    with MessageStore.open(os.path.join(root, "delayed"), StoreConfig(), clock=clock) as s:
        delayed = put_all(s, n, True)
        s._schedule.stop()  # (this benchmark runs the round itself, timed)
        clock.now += 1000
        t0 = time.perf_counter()
        s._schedule.deliver_due()
        deliver = time.perf_counter() - t0
        got = sum(s.get_max_offset_in_queue("D", q) for q in range(QUEUES))
    if got != n:
        raise SystemExit(f"delivered {got} of {n}")
    return {"implementation": IMPLEMENTATION, "messages": n,
            "plain_puts_per_s": round(n / plain), "delayed_puts_per_s": round(n / delayed),
            "deliveries_per_s": round(n / deliver), "deliver_seconds": round(deliver, 3)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--dir", default=None, help="where the stores go (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="write the result here")
    args = ap.parse_args(argv)
    base = tempfile.mkdtemp(prefix="rmq-schedule-", dir=args.dir)
    try:
        r = run(base, args.messages)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    print(f"{r['implementation']}: {r['messages']:,} messages  plain puts {r['plain_puts_per_s']:,}/s  "
          f"delayed puts {r['delayed_puts_per_s']:,}/s  deliveries {r['deliveries_per_s']:,}/s")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(r, fh, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
