"""Long polling (get_messages wait_ms) and the asyncio front (rmqstore.service.aio)."""

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from rmqstore import GetMessageStatus, Message, MessageStore, StoreConfig
from rmqstore.service.aio import AsyncMessageStore

SMALL = StoreConfig(
    mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=20 * 64,
    max_hash_slot_num=32, max_index_num=128,
)


def put_later(store, msg, delay, started):
    def run():
        started.wait()
        time.sleep(delay)
        store.put_message(msg)

    t = threading.Thread(target=run)
    t.start()
    return t


@pytest.mark.parametrize("existing", [0, 3], ids=["new-queue", "caught-up"])
def test_long_poll_returns_the_message_that_arrives(tmp_path, existing):
    with MessageStore.open(tmp_path / "s", config=SMALL) as s:
        for i in range(existing):
            s.put_message(Message("T", b"old%d" % i))
        started = threading.Event()
        t = put_later(s, Message("T", b"new"), 0.05, started)
        started.set()
        r = s.get_messages("T", 0, existing, wait_ms=60_000)
        t.join()
        assert r.status is GetMessageStatus.FOUND
        assert [m.body for m in r.messages] == [b"new"]
        assert r.next_begin_offset == existing + 1


def test_long_poll_times_out_empty(tmp_path):
    with MessageStore.open(tmp_path / "s", config=SMALL) as s:
        s.put_message(Message("T", b"only"))
        t0 = time.monotonic()
        r = s.get_messages("T", 0, 1, wait_ms=200)
        assert time.monotonic() - t0 >= 0.2  # it did wait (a lower bound, not a speed claim)
        assert r.status is GetMessageStatus.OFFSET_OVERFLOW_ONE and r.messages == []
        # no wait: at once, same answer
        assert s.get_messages("T", 0, 1).status is GetMessageStatus.OFFSET_OVERFLOW_ONE


def test_long_poll_ignores_other_queues_and_filtered_tags(tmp_path):
    with MessageStore.open(tmp_path / "s", config=SMALL) as s:
        started = threading.Event()

        def produce():
            started.wait()
            time.sleep(0.03)
            s.put_message(Message("T", b"other-queue", queue_id=1))
            s.put_message(Message("T", b"other-tag", tags="B"))
            time.sleep(0.03)
            s.put_message(Message("T", b"wanted", tags="A"))

        t = threading.Thread(target=produce)
        t.start()
        started.set()
        r = s.get_messages("T", 0, 0, tags="A", wait_ms=60_000)
        t.join()
        assert [m.body for m in r.messages] == [b"wanted"]
        assert r.next_begin_offset == 2  # the filtered unit was passed over


def test_long_poll_under_sync_flush(tmp_path):
    cfg = SMALL.replace(flush_disk_type="SYNC_FLUSH")
    with MessageStore.open(tmp_path / "s", config=cfg) as s:
        started = threading.Event()
        t = put_later(s, Message("T", b"synced"), 0.02, started)
        started.set()
        r = s.get_messages("T", 0, 0, wait_ms=60_000)
        t.join()
        assert [m.body for m in r.messages] == [b"synced"]


def test_close_wakes_long_polls(tmp_path):
    s = MessageStore.open(tmp_path / "s", config=SMALL)
    out = []
    t = threading.Thread(target=lambda: out.append(s.get_messages("T", 0, 0, wait_ms=60_000)))
    t.start()
    time.sleep(0.05)
    s.close()
    t.join(30)
    assert not t.is_alive() and out[0].messages == []


class CountingExecutor(ThreadPoolExecutor):
    """A thread pool that counts the calls sent to it, by function name."""

    def __init__(self):
        super().__init__(2)
        self.calls: list = []

    def submit(self, fn, /, *args, **kwargs):
        name = getattr(fn, "func", fn).__name__
        # (the core's PutGate.put; the thread function of AsyncMessageStore.open)
        self.calls.append({"put": "put_message", "open_in_thread": "open"}.get(name, name))
        return super().submit(fn, *args, **kwargs)


@pytest.mark.parametrize("inline", [True, False])
def test_asyncio_front_runs_on_the_loop_what_does_not_wait(tmp_path, inline):
    """A put (ASYNC_FLUSH), a pull that finds messages or is not to wait and
    the lookups run on the loop's thread (a hop to a thread costs ~100 µs);
    a pull that is to wait for messages, batches, flush and close go to the
    executor, and with inline=False everything does. Answers are the store's."""
    ex = CountingExecutor()

    async def main():
        async with await AsyncMessageStore.open(tmp_path / "s", config=SMALL, executor=ex, inline=inline) as store:
            assert ex.calls == ["open"]
            r = await store.put_message(Message("T", b"a", keys="k"))
            got = await store.get_messages("T", 0, 0, wait_ms=60_000)  # found: no wait
            assert [m.body for m in got.messages] == [b"a"]
            empty = await store.get_messages("T", 0, 1)  # nothing, not to wait
            assert empty.messages == [] and empty.status is GetMessageStatus.OFFSET_OVERFLOW_ONE
            assert (await store.get_message(r.wrote_offset)).body == b"a"
            assert [m.body for m in await store.query_messages("T", "k")] == [b"a"]
            assert await store.get_offset_in_queue_by_time("T", 0, r.store_timestamp) == 0
            on_loop = ["put_message", "get_messages", "get_messages", "get_message", "query_messages",
                       "get_offset_in_queue_by_time"]
            assert ex.calls == ["open"] + ([] if inline else on_loop)
            del ex.calls[1:]
            waiter = asyncio.create_task(store.get_messages("T", 0, 1, wait_ms=60_000))
            await asyncio.sleep(0.02)
            assert not waiter.done() and ex.calls == ["open", "get_messages"]  # waiting in a thread
            await store.put_messages([Message("T", b"b")])
            assert [m.body for m in (await waiter).messages] == [b"b"]
            await store.flush()
            assert ex.calls == ["open", "get_messages", "put_messages", "flush"]
            with pytest.raises(TypeError):  # a wait_ms that is not an int: the store's method decides
                await store.get_messages("T", 0, 2, wait_ms="1")
        assert ex.calls[-2:] == ["get_messages", "close"]

    try:
        asyncio.run(main())
    finally:
        ex.shutdown()


@pytest.mark.parametrize("mode", ["SYNC_FLUSH", "ASYNC_FLUSH", "NO_FLUSH"])
def test_asyncio_front_sync_flush_puts_wait_in_the_executor(tmp_path, mode):
    """Only a SYNC_FLUSH put waits for the disk: it goes to the executor,
    the others run on the loop."""
    ex = CountingExecutor()

    async def main():
        cfg = SMALL.replace(flush_disk_type=mode)
        async with await AsyncMessageStore.open(tmp_path / "s", config=cfg, executor=ex) as store:
            r = await store.put_message(Message("T", b"a"))
            assert (await store.get_message(r.wrote_offset)).body == b"a"
        assert ex.calls == ["open"] + (["put_message"] if mode == "SYNC_FLUSH" else []) + ["close"]

    try:
        asyncio.run(main())
    finally:
        ex.shutdown()


def test_asyncio_front(tmp_path):
    async def main():
        async with await AsyncMessageStore.open(tmp_path / "s", config=SMALL) as store:
            waiter = asyncio.create_task(store.get_messages("T", 0, 0, wait_ms=60_000))
            await asyncio.sleep(0.02)
            assert not waiter.done()  # waiting without blocking the loop
            r = await store.put_message(Message("T", b"async", keys="ak"))
            got = await waiter
            assert [m.body for m in got.messages] == [b"async"]
            assert [m.physical_offset for m in await store.query_messages("T", "ak")] == [r.wrote_offset]
            assert await store.get_offset_in_queue_by_time("T", 0, r.store_timestamp) == 0
            rs = await store.put_messages(Message("T", b"b%d" % i) for i in range(3))
            assert [x.queue_offset for x in rs] == [1, 2, 3]

    asyncio.run(main())


def test_asyncio_front_has_every_public_name_of_the_store(tmp_path):
    """Every public method and attribute of MessageStore (the class's and an
    open store's) is on AsyncMessageStore; the methods are coroutines but
    consumer and iter_messages, which return async iterators."""
    import inspect

    with MessageStore.open(tmp_path / "s", config=SMALL) as s:
        names = {n for n in dir(s) if not n.startswith("_")}
    assert names - set(dir(AsyncMessageStore)) == set()
    iterators = {"consumer", "iter_messages", "open"}
    for n in sorted(names - iterators):
        a = inspect.getattr_static(AsyncMessageStore, n)
        assert isinstance(a, property) or inspect.iscoroutinefunction(a), n
        if not isinstance(a, property):
            assert params(a) == params(getattr(MessageStore, n)), n
    for n in iterators - {"open"}:
        assert params(getattr(AsyncMessageStore, n)) == params(getattr(MessageStore, n)), n


def params(fn) -> list:
    """Parameter names, kinds and defaults (annotations aside)."""
    import inspect

    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_asyncio_front_opens_with_one_async_with(tmp_path):
    async def main():
        async with AsyncMessageStore.open(tmp_path / "s", config=SMALL) as store:
            assert repr(store) == f"<AsyncMessageStore {str(tmp_path / 's')!r} read-write inline>"
            r = await store.put_message(Message("T", b"x"))
            assert store.max_physical_offset == r.wrote_offset + r.wrote_bytes and store.config == SMALL
            assert await store.queues() == [("T", 0)]
            assert [m.body async for m in store.iter_messages()] == [b"x"]
        assert store.closed and repr(store).endswith("read-write closed inline>")
        store = await AsyncMessageStore.open(tmp_path / "s", read_only=True, inline=False)  # the older spelling
        try:
            assert repr(store) == f"<AsyncMessageStore {str(tmp_path / 's')!r} read-only executor>"
            assert [m.body async for m in store.iter_messages()] == [b"x"]
        finally:
            await store.close()

    asyncio.run(main())


def test_a_cancelled_open_closes_the_store_it_opened(tmp_path):
    """The open runs on in its thread; once done, the store is closed: no
    lock is left held, a writable open after it succeeds."""
    gate = threading.Event()

    class Held(ThreadPoolExecutor):
        def submit(self, fn, /, *args, **kwargs):
            def held():
                gate.wait(30)
                return fn(*args, **kwargs)
            return super().submit(held)

    ex = Held(1)

    async def main():
        task = asyncio.create_task(AsyncMessageStore.open(tmp_path / "s", config=SMALL, executor=ex).__aenter__())
        await asyncio.sleep(0.02)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        gate.set()

    try:
        asyncio.run(main())
    finally:
        ex.shutdown(wait=True)
    with MessageStore.open(tmp_path / "s", config=SMALL) as s:  # (the thread closed what it opened)
        assert s.last_exit_ok
