"""Instructions per operation under callgrind: stable where wall time is not.

    python bench/instructions.py build          # Message(...), from the caller's fields
    python bench/instructions.py put            # put_message, one call per message (prebuilt)
    python bench/instructions.py put-built      # build each Message, then put_message it
    python bench/instructions.py put-batch-built  # build 1000 Messages, then put_messages them
    python bench/instructions.py put-batch      # put_messages, batches of 1000
    python bench/instructions.py put-columns    # put_message_columns, 1000 rows per call
    python bench/instructions.py consume        # get_messages, 32 per pull
    python bench/instructions.py consume-views  # get_message_views, 32 per pull
    python bench/instructions.py consume-tags   # get_messages with a tag filter, 32 per pull
    python bench/instructions.py key-lookup     # query_messages
    python bench/instructions.py time-lookup    # get_offset_in_queue_by_time

Runs the workload twice under ``valgrind --tool=callgrind`` (N1 and N2
operations, same setup) and prints (Ir(N2) - Ir(N1)) / (N2 - N1): the user-space
instructions one operation costs, setup and start-up cancelled out. Background
threads are kept idle (flush and clean-up intervals of an hour). Needs
valgrind; takes a minute or two.
"""

import os
import re
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
N1, N2 = 2000, 10000


def workload(kind: str, n: int) -> None:
    sys.path.insert(0, HERE)
    from benchdata import CONFIG, QUEUES, TOPIC, build, message_fields
    from rmqstore import Message, MessageStore

    hour = 3_600_000
    cfg = CONFIG.replace(flush_interval_commit_log=hour, flush_interval_consume_queue=hour)
    if hasattr(cfg, "clean_resource_interval"):
        cfg = cfg.replace(clean_resource_interval=hour)
    fields = message_fields(N2 + 1000)
    msgs = build(fields)
    # puts read the store's own clock, as in use; reads get a fixed one, so
    # every run stores the same timestamps
    ticks = iter(range(1_700_000_000_000, 1_700_000_000_000 + 10 * N2))
    clock = None if kind.startswith("put") else lambda: next(ticks)
    with tempfile.TemporaryDirectory() as d, \
            MessageStore.open(os.path.join(d, "s"), config=cfg, clock=clock) as s:
        if kind == "build":
            for body, qid, tags, keys, uniq, born in fields[:n]:
                Message(TOPIC, body, queue_id=qid, tags=tags, keys=keys, unique_key=uniq, born_timestamp=born)
        elif kind == "put":
            for m in msgs[:n]:
                s.put_message(m)
        elif kind == "put-built":
            put = s.put_message
            for body, qid, tags, keys, uniq, born in fields[:n]:
                put(Message(TOPIC, body, queue_id=qid, tags=tags, keys=keys, unique_key=uniq, born_timestamp=born))
        elif kind == "put-batch-built":
            for i in range(0, n, 1000):
                s.put_messages([
                    Message(TOPIC, body, queue_id=qid, tags=tags, keys=keys, unique_key=uniq, born_timestamp=born)
                    for body, qid, tags, keys, uniq, born in fields[i : i + 1000]
                ])
        elif kind == "put-batch":
            for i in range(0, n, 1000):
                s.put_messages(msgs[i : i + 1000])
        elif kind == "put-columns":  # the same messages as columns (from the caller's fields), 1000 per call
            cols = [(body, qid, tags, keys, uniq) for body, qid, tags, keys, uniq, _ in fields[:n]]
            for i in range(0, n, 1000):
                bodies, qids, tags, keys, uniq = (list(c) for c in zip(*cols[i : i + 1000]))
                s.put_message_columns(TOPIC, bodies, qids, tags=tags, keys=keys, unique_keys=uniq)
        elif kind in ("consume", "consume-views"):
            s.put_messages(msgs[:N2])
            pull = s.get_messages if kind == "consume" else s.get_message_views
            left, q, off = n, 0, 0
            while left > 0:  # round the queues, 32 at a time, from the start again at their end
                r = pull(TOPIC, q % QUEUES, off, min(32, left))
                left -= len(r.messages) if kind == "consume" else len(r.units)
                q += 1
                if q % QUEUES == 0:
                    off = (off + 32) % (N2 // QUEUES // 32 * 32)
        elif kind == "consume-tags":  # the queues of Tag0 (queue q holds Tag{q % 4}): every message kept
            s.put_messages(msgs[:N2])
            per_queue = N2 // QUEUES // 32 * 32
            left, q, off = n, 0, 0
            while left > 0:
                r = s.get_messages(TOPIC, (0, 4)[q % 2], off, min(32, left), "Tag0 || Tag1")
                left -= len(r.messages)
                q += 1
                if q % 2 == 0:
                    off = (off + 32) % per_queue
        elif kind in ("key-lookup", "time-lookup"):
            results = s.put_messages(msgs[:N2])
            for i in range(n):
                j = i * 7919 % N2  # spread over the store, no repeats
                if kind == "key-lookup":
                    assert len(s.query_messages(TOPIC, f"key-{j}")) == 1
                else:
                    r = results[j]
                    assert s.get_offset_in_queue_by_time(TOPIC, j % QUEUES, r.store_timestamp) == r.queue_offset
        else:
            raise SystemExit(f"unknown workload {kind!r}")


def main() -> None:
    if len(sys.argv) == 4 and sys.argv[1] == "--run":
        workload(sys.argv[2], int(sys.argv[3]))
        return
    kind = sys.argv[1] if len(sys.argv) > 1 else "put"
    # cheap operations run more often, so that they outweigh the set-up's
    # run-to-run wobble (a few million instructions)
    n1, n2 = (N1 * 20, N2 * 20) if kind == "consume-views" else (N1, N2)
    counts = []
    for n in (n1, n2):
        with tempfile.NamedTemporaryFile(suffix=".cg") as out:
            proc = subprocess.run(
                ["valgrind", "--tool=callgrind", f"--callgrind-out-file={out.name}", sys.executable,
                 os.path.abspath(__file__), "--run", kind, str(n)],
                capture_output=True, text=True, check=True,
                # the same dict layouts in both runs; numpy's BLAS threads (idle here,
                # but spinning) would add their polling to the count
                env={**os.environ, "PYTHONHASHSEED": "0", "OPENBLAS_NUM_THREADS": "1"},
            )
        counts.append(int(re.search(r"Collected : (\d+)", proc.stderr).group(1)))
    print(f"{kind}: {(counts[1] - counts[0]) / (n2 - n1):,.0f} instructions per operation "
          f"({sys.argv[0]}, N = {n1} and {n2})")


if __name__ == "__main__":
    main()
