"""A producer process and a group of consumer processes over one store.

The producer owns the store (the one writer); each consumer opens it
read-only and iterates ``store.consumer(group, topic, wait_ms=...)``: the
live consumers divide the topic's queues, take over the queues of one that
stops or dies, and commit to the store's ``config/consumerOffset.json``.

    python examples/consumer_group.py                       # 3 consumers, 20,000 messages
    python examples/consumer_group.py --consumers 2 --messages 5000

It prints how many messages each consumer handled and checks that every
message was handled (at least once; exactly once when nothing dies).
"""

from __future__ import annotations

import argparse
import multiprocessing as mp
import os
import sys
import tempfile
import time

from rmqstore import Message, MessageStore

TOPIC, GROUP, QUEUES = "Orders", "billing", 8


def producer(root: str, messages: int, ready) -> None:
    """The writer: opens (creates) the store and puts *messages* orders."""
    with MessageStore.open(root) as store:
        ready.set()
        for i in range(messages):
            store.put_message(Message(TOPIC, b"order %d" % i, queue_id=i % QUEUES, keys=f"order-{i}"))
        # stay open until the consumers are done: a writer process is what
        # a service has; the followers read what it publishes
        deadline = time.monotonic() + 600
        while sum(store.consumer_offsets().get_all(GROUP, TOPIC).values()) < messages:
            if time.monotonic() > deadline:
                raise SystemExit("the consumers did not finish")
            time.sleep(0.05)


def consumer(root: str, name: str, messages: int, results) -> None:
    """A member of the group: handles its share of the queues (which changes
    as members come and go) until the group has committed every message."""
    handled = 0
    with MessageStore.open(root, read_only=True) as store, store.consumer(GROUP, TOPIC, wait_ms=200) as c:
        offsets = store.consumer_offsets()
        while sum(offsets.get_all(GROUP, TOPIC).values()) < messages:
            for _msg in c:  # ends after 200 ms with nothing new
                handled += 1  # the message's work goes here
            c.commit()
    results.put((name, handled))


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description="a producer process and a group of consumer processes")
    ap.add_argument("--messages", type=int, default=20_000, help="a multiple of 8 (the queues)")
    ap.add_argument("--consumers", type=int, default=3)
    ap.add_argument("--dir", default=None, help="where the store goes (default: a temporary directory)")
    args = ap.parse_args(argv)
    messages = args.messages - args.messages % QUEUES
    root = os.path.join(tempfile.mkdtemp(prefix="rmq-group-", dir=args.dir), "store")
    ctx = mp.get_context("spawn")  # (a fresh interpreter per process, as separate services are)
    ready, results = ctx.Event(), ctx.Queue()
    prod = ctx.Process(target=producer, args=(root, messages, ready))
    prod.start()
    ready.wait(60)
    members = [ctx.Process(target=consumer, args=(root, f"consumer-{i}", messages, results))
               for i in range(args.consumers)]
    for p in members:
        p.start()
    handled = dict(results.get(timeout=600) for _ in members)
    for p in members + [prod]:
        p.join(60)
    for name, n in sorted(handled.items()):
        print(f"{name}: {n:,} messages")
    total = sum(handled.values())
    print(f"{total:,} handled of {messages:,} put")
    return 0 if total >= messages and prod.exitcode == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
