"""Put latency: how long one ``put_message`` call takes, as a service that
puts on its request path sees it (not a pytest suite; run it as a script).

For each mode (a set of store settings) it measures, in a fresh store:

- the first put of a store (the call after ``open``), and of a new queue;
- ``--puts`` puts of 256-byte bodies with a key and a UNIQ_KEY each, one
  call each, under ASYNC_FLUSH, over segments small enough that the
  CommitLog, the ConsumeQueues and the index roll several times.

It prints p50, p99, p99.9, p99.99, the maximum and the number of puts over
1 ms (and how many of those were CommitLog rolls), writes them as JSON
(``--json``) and draws the distributions (``--plot``, needs matplotlib).
Only the put call is timed; building each message is not (it never waits
for the disk).

    python bench/latency.py                          # every mode, 1M puts
    python bench/latency.py --mode inline --puts 200000
    python bench/latency.py --json lat.json --plot bench/latency.png
    python bench/latency.py --mode ahead+warm --floor   # and the machine's floor
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import shutil
import sys
import tempfile
import threading
import time

import numpy as np

from rmqstore import Message, MessageStore, StoreConfig

#: the settings of each mode, on top of BASE (StoreConfig field names)
MODES = {
    "inline": {"make_files_ahead": False},
    "ahead": {"warm_maped_file_enable": False},
    "ahead+warm": {"warm_maped_file_enable": True},
}

BODY = 256
TOPIC = "LatencyTopic"


def base_config(segment_mb: int) -> dict:
    return {
        "mapped_file_size_commit_log": segment_mb << 20,
        # the index and the ConsumeQueues roll too: 2 keys a put, 2 queues
        "max_hash_slot_num": 500_000,
        "max_index_num": 2_000_000,
        "mapped_file_size_consume_queue": 300_000 * 20,
    }


def config_for(mode: str, segment_mb: int) -> StoreConfig | None:
    fields = {**base_config(segment_mb), **MODES[mode]}
    known = set(StoreConfig.__dataclass_fields__)
    # an older build (a before/after run) lacks the settings: asked off,
    # it does that anyway; asked on, the mode is skipped
    if any(name not in known and value for name, value in MODES[mode].items()):
        return None
    return StoreConfig(**{k: v for k, v in fields.items() if k in known})


def first_puts(cfg: StoreConfig, root: str, rounds: int) -> tuple:
    """ms of the first put of a new store (*rounds* stores) and of the first
    put to each of *rounds* new queues of one store."""
    body = os.urandom(BODY)
    store_ms = []
    for r in range(rounds):
        d = os.path.join(root, f"first-{r}")
        store = MessageStore.open(d, cfg)
        try:
            msg = Message(TOPIC, body, queue_id=0, keys="k0", unique_key=f"U{r:031d}")
            t0 = time.perf_counter_ns()
            store.put_message(msg)
            store_ms.append((time.perf_counter_ns() - t0) / 1e6)
            queue_ms = []
            for q in range(1, rounds + 1):
                time.sleep(0.05)  # (what a service does between: the store's threads run)
                msg = Message(TOPIC, body, queue_id=100 + q, keys=f"k{q}")
                t0 = time.perf_counter_ns()
                store.put_message(msg)
                queue_ms.append((time.perf_counter_ns() - t0) / 1e6)
        finally:
            store.close()
        shutil.rmtree(d)
    return store_ms, queue_ms


def steady_puts(cfg: StoreConfig, root: str, n: int, settle_ms: int, gc_mode: str) -> dict:
    """Time *n* puts, one call each, starting *settle_ms* after the open (a
    service takes traffic some time after it starts); returns the latencies
    (ns) and where the CommitLog rolled. *gc_mode* "freeze": the objects
    that exist at the start are moved out of the collector's reach
    (``gc.freeze()``, what a latency-minded service does after start-up),
    so full collections do not walk them."""
    d = os.path.join(root, "steady")
    body = os.urandom(BODY)
    lat = np.empty(n, dtype=np.int64)
    rolled = np.zeros(n, dtype=bool)
    fs = cfg.mapped_file_size_commit_log
    clock = time.perf_counter_ns
    store = MessageStore.open(d, cfg)
    time.sleep(settle_ms / 1000)
    if gc_mode == "freeze":
        gc.collect()
        gc.freeze()
    try:
        put = store.put_message
        seg = -1
        for i in range(n):
            msg = Message(TOPIC, body, queue_id=i & 1, keys=f"key-{i}", unique_key=f"{i:032X}")
            t0 = clock()
            r = put(msg)
            lat[i] = clock() - t0
            s = r.wrote_offset // fs
            if s != seg:
                rolled[i] = seg >= 0
                seg = s
    finally:
        store.close()
        if gc_mode == "freeze":
            gc.unfreeze()
    shutil.rmtree(d)
    return {"lat": lat, "rolled": rolled}


def floor_steps(root: str, n: int, settle_ms: int, io_mb_per_s: float, call_ns: int = 0) -> dict:
    """The machine's floor, for the tail figures to be read against: the
    loop of :func:`steady_puts` (each message built, one call timed) with a
    call that never touches a store but lasts *call_ns* (a put's median:
    a call as long is as likely to be the one another thread or the
    hypervisor interrupts), while a thread (with *io_mb_per_s* > 0) appends
    that many MB/s to a file of its own and syncs it every 0.5 s, as the
    store's flush thread does. What this loop shows over 1 ms, no store can
    avoid here."""
    body = os.urandom(BODY)
    lat = np.empty(n, dtype=np.int64)
    stop = threading.Event()

    def writer() -> None:
        chunk = os.urandom(1 << 20)
        fd = os.open(os.path.join(root, "floor-io"), os.O_WRONLY | os.O_CREAT, 0o644)
        try:
            while not stop.wait(0.5):
                for _ in range(max(1, round(io_mb_per_s / 2))):
                    os.write(fd, chunk)
                os.fdatasync(fd)
        finally:
            os.close(fd)

    t = threading.Thread(target=writer, daemon=True) if io_mb_per_s > 0 else None
    if t is not None:
        t.start()
    time.sleep(settle_ms / 1000)
    clock = time.perf_counter_ns
    kept: list = []
    try:
        for i in range(n):
            msg = Message(TOPIC, body, queue_id=i & 1, keys=f"key-{i}", unique_key=f"{i:032X}")
            t0 = clock()
            kept.append(msg.keys)  # (a call that touches no store)
            while clock() - t0 < call_ns:
                pass
            lat[i] = clock() - t0
            if len(kept) > 1024:
                kept.clear()
    finally:
        stop.set()
        if t is not None:
            t.join()
    return {"lat": lat, "rolled": np.zeros(n, dtype=bool)}


def summary(lat_ns, rolled) -> dict:
    us = lat_ns / 1000.0
    slow = lat_ns > 1_000_000
    return {
        "puts": len(lat_ns),
        "p50_us": float(np.percentile(us, 50)),
        "p99_us": float(np.percentile(us, 99)),
        "p99.9_us": float(np.percentile(us, 99.9)),
        "p99.99_us": float(np.percentile(us, 99.99)),
        "max_us": float(us.max()),
        "over_1ms": int(slow.sum()),
        "over_1ms_rolls": int((slow & rolled).sum()),
        "rolls": int(rolled.sum()),
        "rolls_max_us": float(us[rolled].max()) if rolled.any() else 0.0,
    }


def plot(results: dict, path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax, tail) = plt.subplots(1, 2, figsize=(11, 4.2))
    bins = np.logspace(0, 5.5, 111)  # 1 µs .. 316 ms
    for mode, r in results.items():
        us = np.sort(r["lat"] / 1000.0)
        ax.hist(us, bins=bins, histtype="step", label=mode, linewidth=1.2)
        # the tail: how many puts took longer than x
        tail.step(us, np.arange(us.size, 0, -1), where="post", label=mode, linewidth=1.2)
    n = next(iter(results.values()))["lat"].size
    for a in (ax, tail):
        a.set_xscale("log")
        a.set_yscale("log")
        a.set_xlabel("put_message latency (µs)")
        a.axvline(1000, color="grey", linestyle=":", linewidth=1)
    ax.set_xlim(1, 10**5.5)
    tail.set_xlim(10, 10**5.5)
    tail.set_ylim(0.8, n)
    ax.set_ylabel("puts")
    tail.set_ylabel("puts slower than x")
    ax.set_title(f"{n:,} puts of {BODY} B, ASYNC_FLUSH, one call each")
    tail.set_title("the tail")
    tail.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--mode", action="append", choices=sorted(MODES), help="a mode to run (default: all)")
    ap.add_argument("--puts", type=int, default=1_000_000, help="timed puts per mode (default 1000000)")
    ap.add_argument("--segment-mb", type=int, default=64, help="CommitLog segment size in MiB (default 64)")
    ap.add_argument("--first-rounds", type=int, default=5, help="new stores and new queues timed (default 5)")
    ap.add_argument("--settle-ms", type=int, default=1000,
                    help="pause between open and the first timed put, ms (default 1000)")
    ap.add_argument("--gc", choices=("on", "freeze"), default="on",
                    help="the cycle collector as is, or gc.freeze() after start-up (default on)")
    ap.add_argument("--dir", help="where to make the stores (default: a temporary directory)")
    ap.add_argument("--floor", action="store_true",
                    help="also time the same loop with a call as long as a put that touches no store, "
                         "quiet and beside a thread writing and syncing as much as the store does "
                         "(the machine's floor)")
    ap.add_argument("--json", help="write the summaries here")
    ap.add_argument("--plot", help="draw the distributions into this PNG (needs matplotlib)")
    args = ap.parse_args(argv)
    root = tempfile.mkdtemp(prefix="rmqstore-latency-", dir=args.dir)
    results: dict = {}
    report: dict = {}
    try:
        for mode in args.mode or list(MODES):
            cfg = config_for(mode, args.segment_mb)
            if cfg is None:
                print(f"{mode}: this build has no such settings, skipped", file=sys.stderr)
                continue
            store_ms, queue_ms = first_puts(cfg, root, args.first_rounds)
            r = steady_puts(cfg, root, args.puts, args.settle_ms, args.gc)
            results[mode] = r
            s = summary(r["lat"], r["rolled"])
            s["first_put_of_store_ms"] = sorted(store_ms)
            s["first_put_of_queue_ms"] = sorted(queue_ms)
            report[mode] = s
            print(f"{mode:>11}: p50 {s['p50_us']:.2f} µs  p99 {s['p99_us']:.2f}  p99.9 {s['p99.9_us']:.1f}  "
                  f"p99.99 {s['p99.99_us']:.1f}  max {s['max_us']:.0f} µs  >1ms {s['over_1ms']} "
                  f"({s['over_1ms_rolls']} rolls of {s['rolls']}; slowest roll {s['rolls_max_us']:.0f} µs)  "
                  f"first put: store {np.median(store_ms):.2f} ms (max {max(store_ms):.2f}), "
                  f"new queue {np.median(queue_ms):.2f} ms (max {max(queue_ms):.2f})", flush=True)
        if args.floor:
            # as long as the fastest mode's median put (0.7 µs when none ran)
            call_ns = round(min(s["p50_us"] for s in report.values()) * 1000) if report else 700
            # ~370 B a put at ~300k puts/s: the store writes about 110 MB/s
            for name, rate in (("floor", 0.0), ("floor+io", 110.0)):
                r = floor_steps(root, args.puts, args.settle_ms, rate, call_ns)
                results[name] = r
                s = summary(r["lat"], r["rolled"])
                report[name] = s
                print(f"{name:>11}: p50 {s['p50_us']:.2f} µs  p99 {s['p99_us']:.2f}  p99.9 {s['p99.9_us']:.1f}  "
                      f"p99.99 {s['p99.99_us']:.1f}  max {s['max_us']:.0f} µs  >1ms {s['over_1ms']}", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1)
    if args.plot and results:
        plot(results, args.plot)
    return 0


if __name__ == "__main__":
    sys.exit(main())
