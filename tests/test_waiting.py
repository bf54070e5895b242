"""Long polling (get_messages wait_ms) and the asyncio front (rmqstore.aio)."""

import asyncio
import threading
import time

import pytest

from rmqstore import GetMessageStatus, Message, MessageStore, StoreConfig
from rmqstore.aio import AsyncMessageStore

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
