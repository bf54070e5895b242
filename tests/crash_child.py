"""The producer side of the kill -9 tests (``test_crash.py``), and the message
scheme both sides share.

Every message is self-describing: its key names the crash round, producer
thread, sequence number, topic, queue and body size, and its body is a pure
function of that key (:func:`make_body`). So any record a store hands back can
be checked against what a producer could have written (:func:`check_message`):
garbage, a stale record from another place, or a record whose bytes were mixed
up cannot pass.

The child (:func:`run_child`) runs in a process forked from the test process.
It opens the store, writes ``ready``, then its producer threads put messages
forever; after each ``put_message``/``put_messages`` RETURNS it writes one ack
line per message to the pipe, in a single ``os.write`` of at most PIPE_BUF
bytes (atomic, so a SIGKILL never leaves half an ack batch from one thread
interleaved with another's). Nothing here ever returns into pytest: the caller
wraps it in ``try/finally: os._exit``.
"""

from __future__ import annotations

import hashlib
import os
import random
import select
import threading
import time
import traceback

STORE_HOST = "10.20.30.40:10911"
# (topic, number of queues)
TOPICS = (("CrashA", 1), ("CrashB", 2), ("CrashC", 4))
QUEUES = tuple((topic, q) for topic, n in TOPICS for q in range(n))
PIPE_BUF = getattr(select, "PIPE_BUF", 4096)


# --- the message scheme ----------------------------------------------------------------------


def make_key(round_tag: str, thread: int, seq: int, topic_index: int, queue_id: int, size: int) -> str:
    return f"{round_tag}-t{thread}-{seq}-{topic_index}{queue_id}-{size}"


def parse_key(key: str):
    """``(round_tag, thread, seq, topic, queue_id, size)`` or None when *key* is
    not one :func:`make_key` makes."""
    parts = key.split("-")
    if len(parts) != 5 or not parts[1].startswith("t") or len(parts[3]) < 2:
        return None
    try:
        ti, qid = int(parts[3][0]), int(parts[3][1:])
        thread, seq, size = int(parts[1][1:]), int(parts[2]), int(parts[4])
    except ValueError:
        return None
    if not 0 <= ti < len(TOPICS) or not 0 <= qid < TOPICS[ti][1]:
        return None
    return parts[0], thread, seq, TOPICS[ti][0], qid, size


def make_body(key: str) -> bytes:
    """The body of the message with *key*: seeded random bytes of the size the
    key names (0 for an empty body)."""
    size = int(key.rsplit("-", 1)[1])
    return random.Random(key).randbytes(size)


def unique_key_of(key: str) -> str:
    return hashlib.sha1(key.encode()).hexdigest()[:32].upper()


def tags_of(key: str) -> str:
    return "Tag" + str(int(key.split("-")[2]) % 3)


def body_sha1(body) -> str:
    return hashlib.sha1(body).hexdigest()


def check_message(m) -> str:
    """Assert that the stored message *m* is one a producer wrote; returns its key."""
    key = m.keys
    parsed = parse_key(key) if isinstance(key, str) else None
    assert parsed is not None, f"record at {m.physical_offset} has no producer key: {m!r} keys={key!r}"
    _tag, _thread, _seq, topic, qid, size = parsed
    assert (m.topic, m.queue_id) == (topic, qid), (key, m)
    assert len(m.body) == size and m.body == make_body(key), f"body of {key} at {m.physical_offset} differs"
    assert m.unique_key == unique_key_of(key), (key, m.unique_key)
    assert m.tags == tags_of(key), (key, m.tags)
    assert m.store_host == STORE_HOST and m.born_host == STORE_HOST
    return key


# --- acks ----------------------------------------------------------------------------------------


class Ack:
    __slots__ = ("key", "topic", "queue_id", "queue_offset", "physical_offset", "size", "store_timestamp", "msg_id",
                 "sha1")

    def __init__(self, key, topic, queue_id, queue_offset, physical_offset, size, store_timestamp, msg_id, sha1):
        self.key, self.topic, self.queue_id, self.queue_offset = key, topic, queue_id, queue_offset
        self.physical_offset, self.size, self.store_timestamp = physical_offset, size, store_timestamp
        self.msg_id, self.sha1 = msg_id, sha1

    def __repr__(self):
        return f"Ack({self.key} {self.topic}/{self.queue_id}@{self.queue_offset} phy={self.physical_offset})"


def ack_line(key: str, body, result) -> bytes:
    """``A key qoff phy size ts msgid sha1``; topic and queue are in the key."""
    return (
        f"A {key} {result.queue_offset} {result.wrote_offset} {result.wrote_bytes} "
        f"{result.store_timestamp} {result.msg_id} {body_sha1(body)}\n"
    ).encode()


def parse_ack(line: str) -> Ack:
    _a, key, qoff, phy, size, ts, msg_id, sha = line.split(" ")
    parsed = parse_key(key)
    assert parsed is not None, line
    return Ack(key, parsed[3], parsed[4], int(qoff), int(phy), int(size), int(ts), msg_id, sha)


# --- the child --------------------------------------------------------------------------------------


def _write_all_atomic(fd: int, data: bytes) -> None:
    assert len(data) <= PIPE_BUF
    n = os.write(fd, data)  # a blocking pipe write of <= PIPE_BUF bytes is all-or-nothing
    assert n == len(data)


def _size(rnd: random.Random) -> int:
    r = rnd.random()
    if r < 0.1:
        return 0
    if r < 0.75:
        return rnd.randrange(1, 200)
    if r < 0.97:
        return rnd.randrange(200, 2000)
    return rnd.randrange(4000, 20000)


def run_child(root, config, seed: int, round_tag: str, wfd: int, threads: int = 3, cap_seconds: float = 10.0,
              pause: float = 0.0) -> int:
    """Body of the forked child: open the store (recovery runs), say ``ready``,
    put messages from *threads* producer threads until killed. Each producer
    sleeps up to *pause* seconds (random) between puts, which bounds how much
    one round writes. Returns an exit code only when the safety cap or an
    error stops it; the caller ``os._exit``s."""
    from rmqstore import Message, MessageStore

    store = MessageStore.open(root, config=config, store_host=STORE_HOST)
    _write_all_atomic(wfd, b"ready\n")
    deadline = time.monotonic() + cap_seconds
    failed = []

    def producer(t: int) -> None:
        rnd = random.Random(f"{seed}/{t}")
        seq = 0
        try:
            while time.monotonic() < deadline:
                n = 1 if rnd.random() < 0.6 else rnd.randint(2, 20)
                keys, msgs = [], []
                for _ in range(n):
                    ti = rnd.randrange(len(TOPICS))
                    topic, nq = TOPICS[ti]
                    qid = rnd.randrange(nq)
                    key = make_key(round_tag, t, seq, ti, qid, _size(rnd))
                    seq += 1
                    keys.append(key)
                    msgs.append(Message(topic, make_body(key), queue_id=qid, tags=tags_of(key), keys=key,
                                        unique_key=unique_key_of(key)))
                if n == 1:
                    results = [store.put_message(msgs[0])]
                else:
                    results = store.put_messages(msgs)
                # acks only after the put returned
                lines = [ack_line(k, m.body, r) for k, m, r in zip(keys, msgs, results)]
                data = b"".join(lines)
                if len(data) <= PIPE_BUF:
                    _write_all_atomic(wfd, data)
                else:  # never with these sizes; keep each line whole anyway
                    for line in lines:
                        _write_all_atomic(wfd, line)
                if pause:
                    time.sleep(rnd.uniform(0, pause))
        except BaseException:
            failed.append(traceback.format_exc())
            msg = ("E " + traceback.format_exc().replace("\n", " | ") + "\n").encode(errors="replace")[: PIPE_BUF - 1]
            try:
                os.write(wfd, msg if msg.endswith(b"\n") else msg + b"\n")
            except OSError:
                pass

    ts = [threading.Thread(target=producer, args=(t,), daemon=True) for t in range(threads)]
    for th in ts:
        th.start()
    for th in ts:
        th.join()
    return 4 if failed else 3
