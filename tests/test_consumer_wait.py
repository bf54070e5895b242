"""A consumer that waits for new messages (``consumer(..., wait_ms=...)``),
synchronous and ``async for``: what arrives is delivered, a wait ends on
time, on close (of the consumer or the store), on KeyboardInterrupt and on a
task's cancellation, and none of these loses or skips a message."""

from __future__ import annotations

import asyncio
import math
import os
import signal
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest import no_hang
from rmqstore import ArgumentError, Message, MessageStore, MessageTypeError, StoreConfig
from rmqstore.service.aio import AsyncConsumer, AsyncMessageStore

SMALL = StoreConfig(
    mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 64,
    max_hash_slot_num=32, max_index_num=128,
)


def once_waiting(store, fn, *args):
    """Run fn(*args) in a thread once a pull of *store* waits for arrivals
    (however slow the machine is to get there)."""
    def run():
        deadline = time.monotonic() + 30
        while not store._waiting and time.monotonic() < deadline:
            time.sleep(0.005)
        fn(*args)

    t = threading.Thread(target=run)
    t.start()
    return t


def test_a_waiting_consumer_gets_what_arrives_in_any_queue_and_a_new_queue(tmp_path):
    with no_hang(30), MessageStore.open(tmp_path / "s", SMALL) as s:
        s.put_message(Message("T", b"old", queue_id=0))

        def produce():
            time.sleep(0.05)
            s.put_message(Message("T", b"q1", queue_id=1))  # a queue the consumer has not seen
            time.sleep(0.05)
            s.put_message(Message("Other", b"x"))  # another topic: not for it
            s.put_message(Message("T", b"q0", queue_id=0))

        t = threading.Thread(target=produce)
        t.start()
        got = []
        with s.consumer("G", "T", wait_ms=60_000) as c:
            for m in c:
                got.append(m.body)
                if len(got) == 3:
                    break
            c.commit()
        t.join()
        assert got == [b"old", b"q1", b"q0"]
        assert s.get_committed_offset("G", "T", 0) == 2 and s.get_committed_offset("G", "T", 1) == 1


def test_a_wait_ends_after_wait_ms_with_nothing_new(tmp_path):
    with MessageStore.open(tmp_path / "s", SMALL) as s:
        s.put_message(Message("T", b"a"))
        c = s.consumer("G", "T", wait_ms=150)
        t0 = time.monotonic()
        assert [m.body for m in c] == [b"a"]
        assert time.monotonic() - t0 >= 0.15  # it waited (a lower bound, no speed claim)
        assert s.get_committed_offset("G", "T", 0) == 1  # the last message, asked past, is committed
        c.close()  # (a live member of the group would keep its queue)
        # no wait_ms: at once, as before
        s.put_message(Message("T", b"b"))
        assert [m.body for m in s.consumer("G", "T")] == [b"b"]


def test_filtered_out_arrivals_are_passed_over_and_committed_while_waiting(tmp_path):
    with no_hang(30), MessageStore.open(tmp_path / "s", SMALL) as s:
        def produce():
            time.sleep(0.05)
            for i in range(3):
                s.put_message(Message("T", b"skip%d" % i, tags="B"))
            time.sleep(0.1)
            s.put_message(Message("T", b"want", tags="A"))

        t = threading.Thread(target=produce)
        t.start()
        c = s.consumer("G", "T", tags="A", wait_ms=60_000)
        assert next(c).body == b"want"
        t.join()
        c.commit()
        assert s.get_committed_offset("G", "T", 0) == 4


@pytest.mark.parametrize("closer", ["consumer", "store"])
def test_a_close_from_another_thread_ends_a_waiting_iteration(tmp_path, closer):
    s = MessageStore.open(tmp_path / "s", SMALL)
    try:
        s.put_message(Message("T", b"a"))
        c = s.consumer("G", "T", wait_ms=math.inf)
        assert next(c).body == b"a"
        t = once_waiting(s, c.close if closer == "consumer" else s.close)
        with no_hang(30), pytest.raises(StopIteration):
            next(c)  # waits until the close
        t.join()
        if closer == "consumer":
            assert s.get_committed_offset("G", "T", 0) == 1  # the message asked past was committed
    finally:
        s.close()
    with MessageStore.open(tmp_path / "s", SMALL) as s:
        assert s.get_committed_offset("G", "T", 0) == 1


def test_keyboard_interrupt_while_waiting_loses_nothing(tmp_path):
    with MessageStore.open(tmp_path / "s", SMALL) as s:
        for i in range(2):
            s.put_message(Message("T", b"m%d" % i))
        c = s.consumer("G", "T", wait_ms=math.inf)
        assert [next(c).body, next(c).body] == [b"m0", b"m1"]
        t = once_waiting(s, os.kill, os.getpid(), signal.SIGINT)  # (a real signal: Ctrl-C)
        with no_hang(30), pytest.raises(KeyboardInterrupt):
            next(c)
        t.join()
        assert c.in_flight is None and s.get_committed_offset("G", "T", 0) == 2  # m1 processed, committed
        s.put_message(Message("T", b"m2"))
        assert next(c).body == b"m2"  # the consumer goes on


@pytest.mark.parametrize("bad,error", [(-1, ArgumentError), (math.nan, ArgumentError), (-math.inf, ArgumentError),
                                       ("1", MessageTypeError), (True, MessageTypeError)])
def test_bad_wait_ms_is_refused_at_once(tmp_path, bad, error):
    with MessageStore.open(tmp_path / "s", SMALL) as s, pytest.raises(error, match="wait_ms"):
        s.consumer("G", "T", wait_ms=bad)


# --- async for ------------------------------------------------------------------------------


def test_async_for_waits_without_blocking_the_loop(tmp_path):
    async def main():
        async with AsyncMessageStore.open(tmp_path / "s", config=SMALL) as store:
            c = store.consumer("G", "T", wait_ms=60_000)
            assert isinstance(c, AsyncConsumer)
            got = []

            async def consume():
                async for m in c:
                    got.append(m.body)
                    if len(got) == 3:
                        return

            task = asyncio.create_task(consume())
            for i in range(3):
                await asyncio.sleep(0.03)  # the loop runs while the consumer waits
                await store.put_message(Message("T", b"a%d" % i, queue_id=i % 2))
            await asyncio.wait_for(task, 30)
            assert got == [b"a0", b"a1", b"a2"]
            await c.close()
            # a2 was in flight (the loop left after it): the group gets it again
            assert await store.get_committed_offset("G", "T", 0) == 1
            assert await store.get_committed_offset("G", "T", 1) == 1

    asyncio.run(main())


def test_async_for_ends_after_wait_ms_and_commits(tmp_path):
    async def main():
        async with AsyncMessageStore.open(tmp_path / "s", config=SMALL) as store:
            await store.put_messages(Message("T", b"m%d" % i) for i in range(5))
            got = [m.body async for m in store.consumer("G", "T", wait_ms=50)]
            assert got == [b"m%d" % i for i in range(5)]
            assert await store.get_committed_offset("G", "T", 0) == 5

    asyncio.run(main())


def test_a_cancelled_wait_leaves_nothing_in_flight(tmp_path):
    async def main():
        async with AsyncMessageStore.open(tmp_path / "s", config=SMALL) as store:
            await store.put_message(Message("T", b"first"))
            c = store.consumer("G", "T", wait_ms=math.inf)
            assert (await c.__anext__()).body == b"first"
            task = asyncio.create_task(c.__anext__())
            await asyncio.sleep(0.05)
            assert not task.done()
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert c.consumer.in_flight is None
            assert await store.get_committed_offset("G", "T", 0) == 1
            await store.put_message(Message("T", b"second"))
            assert (await asyncio.wait_for(c.__anext__(), 30)).body == b"second"

    asyncio.run(main())


class SlowSteps(ThreadPoolExecutor):
    """An executor whose consumer steps take 0.2 s: a cancellation lands while one runs."""

    def submit(self, fn, /, *args, **kwargs):
        if getattr(getattr(fn, "func", fn), "__name__", "") == "_step":
            inner = fn

            def fn():
                time.sleep(0.2)
                return inner()

        return super().submit(fn, *args, **kwargs)


def test_a_step_cancelled_in_its_thread_hands_its_message_out_next(tmp_path):
    """inline=False: the pull runs in a thread; the task is cancelled while
    it runs; the message it took is the next one handed out (not skipped)."""
    ex = SlowSteps(2)

    async def main():
        async with AsyncMessageStore.open(tmp_path / "s", config=SMALL, executor=ex, inline=False) as store:
            await store.put_messages(Message("T", b"m%d" % i) for i in range(3))
            c = store.consumer("G", "T")
            task = asyncio.create_task(c.__anext__())
            await asyncio.sleep(0.05)  # the step sleeps in its thread
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task
            assert [m.body async for m in c] == [b"m0", b"m1", b"m2"]
            assert await store.get_committed_offset("G", "T", 0) == 3

    try:
        asyncio.run(main())
    finally:
        ex.shutdown()


def test_closing_the_store_ends_an_async_consumer(tmp_path):
    async def main():
        store = await AsyncMessageStore.open(tmp_path / "s", config=SMALL)
        try:
            c = store.consumer("G", "T", wait_ms=math.inf)
            task = asyncio.create_task(c.__anext__())
            await asyncio.sleep(0.05)
            await store.close()
            with pytest.raises(StopAsyncIteration):
                await asyncio.wait_for(task, 30)
        finally:
            await store.close()

    asyncio.run(main())


def test_closing_an_async_consumer_from_another_task_ends_its_loop(tmp_path):
    async def main():
        async with AsyncMessageStore.open(tmp_path / "s", config=SMALL) as store:
            await store.put_message(Message("T", b"only"))
            c = store.consumer("G", "T", wait_ms=math.inf)
            got = []

            async def consume():
                async for m in c:
                    got.append(m.body)

            task = asyncio.create_task(consume())
            await asyncio.sleep(0.05)  # it handled "only" and waits for more
            await asyncio.wait_for(c.close(), 30)  # (before: waited for the waiting thread forever)
            await asyncio.wait_for(task, 30)
            assert got == [b"only"] and c.consumer.closed
            assert await store.get_committed_offset("G", "T", 0) == 1  # "only" was asked past: committed

    asyncio.run(main())
