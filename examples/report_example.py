"""The picture in the README's report section: a sample store and its report.

Writes two hours of three topics (a traffic peak on one, a growing one) with
a store clock, commits two consumer groups' offsets behind the ends, and
renders ``rmqstore report`` of it (needs ``pip install 'rmqstore[report]'``).

    python examples/report_example.py                      # report.png here
    python examples/report_example.py --out report.html --dir sample   # the store in ./sample/store
"""

from __future__ import annotations

import argparse
import os
import random
import tempfile

from rmqstore import Message, MessageStore, StoreConfig
from rmqstore.report import write_report

START_MS = 1_764_000_000_000  # a fixed store time: the same picture every run


def make_sample_store(root: str) -> None:
    """Two hours of OrderTopic (a peak in the middle hour), PaymentTopic
    (steady) and AuditTopic (growing, larger bodies), 4 queues each; groups
    billing and shipping committed behind the ends."""
    now = [START_MS]
    cfg = StoreConfig(mapped_file_size_commit_log=8 << 20, schedule_service_enable=False)
    rnd = random.Random(7)
    with MessageStore.open(root, config=cfg, clock=lambda: now[0]) as store:
        for minute in range(120):
            rates = {"OrderTopic": 700 if 40 <= minute < 80 else 400, "PaymentTopic": 150,
                     "AuditTopic": 60 + 2 * minute}
            for topic, n in rates.items():
                batch = []
                for i in range(n):
                    now[0] = START_MS + minute * 60_000 + i * 60_000 // n
                    size = 900 if topic == "AuditTopic" else 200
                    batch.append(Message(topic, rnd.randbytes(size), queue_id=i % 4, keys=f"{topic}-{minute}-{i}"))
                store.put_messages(batch)
        for q in range(4):
            store.commit_offset("billing", "PaymentTopic", q,
                                store.get_max_offset_in_queue("PaymentTopic", q) - 40 * (q + 1))
            store.commit_offset("shipping", "OrderTopic", q, store.get_max_offset_in_queue("OrderTopic", q) // 2)


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--out", default="report.png", help="the report file, .png or .html (default report.png)")
    ap.add_argument("--dir", help="where to make the store (default: a temporary directory)")
    args = ap.parse_args(argv)
    base = args.dir or tempfile.mkdtemp(prefix="rmqstore-report-")
    root = os.path.join(base, "store")
    make_sample_store(root)
    write_report(root, args.out)
    print(f"wrote {args.out} (the store: {root})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
