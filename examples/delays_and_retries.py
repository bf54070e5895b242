"""Delayed delivery, retries and dead letters in one writer process.

A producer puts a reminder to be delivered one second later
(``Message(..., delay_level=1)``) and a few orders, one of which always fails
("poison"). The group's consumer hands each failed message back with
``consumer.reconsume_later(msg)``: it comes back after its delay, with its
reconsume count raised, and once it has been retried ``max_reconsume_times``
times it is parked in the group's dead-letter topic ``%DLQ%billing``
instead. The store is RocketMQ's: the delayed and retried records sit in
``SCHEDULE_TOPIC_XXXX`` and ``%RETRY%billing`` as a broker keeps them.

    python examples/delays_and_retries.py
    python examples/delays_and_retries.py --retries 3

It prints when each message arrived and how the poison message ended.
(The delay levels are shortened to one second each so it runs in seconds;
RocketMQ's defaults are 1s 5s 10s 30s 1m ... 2h.)
"""

from __future__ import annotations

import argparse
import tempfile
import time

from rmqstore import Message, MessageStore, StoreConfig

GROUP, TOPIC = "billing", "Orders"


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--retries", type=int, default=2, help="max_reconsume_times of the consumer (default 2)")
    ap.add_argument("--dir", help="where to make the store (default: a temporary directory)")
    args = ap.parse_args(argv)
    root = args.dir or tempfile.mkdtemp(prefix="rmqstore-delays-")
    config = StoreConfig(message_delay_level=" ".join(["1s"] * 18))  # every level one second
    start = time.monotonic()

    def at() -> str:
        return f"{time.monotonic() - start:4.1f} s"

    with MessageStore.open(root, config) as store:
        store.put_message(Message(TOPIC, b"reminder", delay_level=1))
        for body in (b"order 1", b"poison", b"order 2"):
            store.put_message(Message(TOPIC, body))
        handled = set()
        with store.consumer(GROUP, TOPIC, wait_ms=1500, max_reconsume_times=args.retries) as consumer:
            for m in consumer:  # ends after 1.5 s with nothing new
                tries = f" (retry {m.reconsume_times})" if m.reconsume_times else ""
                print(f"{at()}  {m.body.decode()}{tries}")
                if m.body == b"poison":
                    consumer.reconsume_later(m)  # failed: again later, or to the dead-letter topic
                else:
                    handled.add(m.body)
        dead = store.get_messages(f"%DLQ%{GROUP}", 0, 0).messages
        for m in dead:
            print(f"{m.body.decode()}: tried {m.reconsume_times} times, parked in %DLQ%{GROUP} "
                  f"(first topic {m.properties['RETRY_TOPIC']})")
        ok = handled == {b"reminder", b"order 1", b"order 2"} and [m.body for m in dead] == [b"poison"]
    print("all handled" if ok else "something is missing")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
