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


def make_messages(n=N, seed=1234):
    rnd = random.Random(seed)
    return [
        Message(
            TOPIC,
            rnd.randbytes(BODY_SIZE),
            queue_id=i % QUEUES,
            tags=f"Tag{i % 4}",
            keys=f"key-{i}",
            unique_key=f"{seed:08X}{i:024X}",
            born_timestamp=1_700_000_000_000 + i,
        )
        for i in range(n)
    ]
