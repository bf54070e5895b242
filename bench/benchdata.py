"""Seeded benchmark data shared by the benchmark modules.

Size knob: RMQSTORE_BENCH_N (messages per workload, default 20000).
"""

import os
import random

from rmqstore import Message, StoreConfig

N = int(os.environ.get("RMQSTORE_BENCH_N", "20000"))
QUEUES = 8
TOPIC = "BenchTopic"
BODY_SIZE = 256
# 64 MiB CommitLog files keep setup cheap; everything else is RocketMQ's default
CONFIG = StoreConfig(mapped_file_size_commit_log=64 * 1024 * 1024)


def message_fields(n=N, seed=1234):
    """What a producer has before it makes each message: ``(body, queue_id,
    tags, keys, unique_key, born_timestamp)`` per message (seeded)."""
    rnd = random.Random(seed)
    return [
        (rnd.randbytes(BODY_SIZE), i % QUEUES, f"Tag{i % 4}", f"key-{i}", f"{seed:08X}{i:024X}",
         1_700_000_000_000 + i)
        for i in range(n)
    ]


def build(fields):
    """The messages of *fields* (message_fields' rows), made as a caller makes them."""
    return [
        Message(TOPIC, body, queue_id=qid, tags=tags, keys=keys, unique_key=uniq, born_timestamp=born)
        for body, qid, tags, keys, uniq, born in fields
    ]


def make_messages(n=N, seed=1234):
    return build(message_fields(n, seed))
