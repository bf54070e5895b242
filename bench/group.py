"""Consumer groups across processes: messages per second that one, two (or
more) consumer processes of one group drain from a store over 8 queues
(not a pytest suite; run it as a script).

A writer fills the store with ``--messages`` 256-byte messages round robin
over the queues and closes it. Then ``--members`` processes open it
read-only (followers), each iterates ``store.consumer(group, topic)`` (its
share of the queues, under leases) and stops when every queue's committed
offset is the end; the time is from the first member's start to the last
member's exit, so it includes opening the store, joining the group and
every commit. Commits are per message on disk (``sync=True``, the default)
or deferred (``--deferred``, persisted at a rebalance and at the end).

    python bench/group.py                            # 1 and 2 members, 200k messages
    python bench/group.py --members 1 2 4 --messages 400000 --deferred
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time

from rmqstore import Message, MessageStore, StoreConfig

QUEUES = 8
BODY = bytes(range(256))

MEMBER = """
import sys, time
from rmqstore import MessageStore
root, group, sync, total = sys.argv[1], sys.argv[2], sys.argv[3] == "1", int(sys.argv[4])
n = 0
with MessageStore.open(root, read_only=True) as store:
    c = store.consumer(group, "G", sync=sync, wait_ms=50)
    offsets = store.consumer_offsets()
    while True:
        for m in c:
            n += 1
        c.commit()
        offsets.flush()  # (deferred commits: the other members see them now, not in 5 s)
        if sum(offsets.get_all(group, "G").values()) >= total:
            break
    c.close()
print(n)
"""


def fill(root: str, messages: int) -> None:
    with MessageStore.open(root, StoreConfig()) as s:
        batch = []
        for i in range(messages):
            batch.append(Message("G", BODY, queue_id=i % QUEUES))
            if len(batch) == 1000:
                s.put_messages(batch)
                batch = []
        if batch:
            s.put_messages(batch)


def run(root: str, members: int, total: int, sync: bool, group: str) -> dict:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(filter(None, [os.getcwd(), os.environ.get("PYTHONPATH")])))
    t0 = time.perf_counter()
    procs = [subprocess.Popen([sys.executable, "-c", MEMBER, root, group, "1" if sync else "0", str(total)],
                              stdout=subprocess.PIPE, text=True, env=env) for _ in range(members)]
    counts = [int(p.communicate()[0]) for p in procs]
    seconds = time.perf_counter() - t0
    if any(p.returncode for p in procs):
        raise SystemExit("a member failed")
    return {"members": members, "messages": total, "delivered": sum(counts), "per_member": counts,
            "seconds": round(seconds, 3), "msgs_per_s": round(total / seconds)}


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--messages", type=int, default=200_000)
    ap.add_argument("--members", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--deferred", action="store_true", help="commit with sync=False")
    ap.add_argument("--dir", default=None, help="where the store goes (default: a temporary directory)")
    ap.add_argument("--json", default=None, help="write the results here")
    args = ap.parse_args(argv)
    base = tempfile.mkdtemp(prefix="rmq-group-", dir=args.dir)
    try:
        root = os.path.join(base, "store")
        fill(root, args.messages)
        results = []
        for i, n in enumerate(args.members):
            r = run(root, n, args.messages, not args.deferred, f"bench{i}")
            results.append(r)
            print(f"{n} member(s): {r['msgs_per_s']:>9,} msgs/s  ({r['seconds']} s, delivered {r['delivered']}, "
                  f"per member {r['per_member']})")
        if args.json:
            with open(args.json, "w") as fh:
                json.dump(results, fh, indent=1)
    finally:
        shutil.rmtree(base, ignore_errors=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
