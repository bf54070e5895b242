"""asyncio front for :class:`rmqstore.MessageStore`.

Calls that wait by design run the store method in an executor thread: a long
poll (``wait_ms``) that finds nothing waits there on the store's condition,
not in a busy loop, and so do SYNC_FLUSH puts (they wait for the disk),
batches, ``flush``, ``open`` and ``close``. The others (a pull that finds
messages, lookups, an ASYNC_FLUSH put) take about a microsecond and run on
the loop's thread, because a hop to a thread and back costs ~100 µs on a
small machine (``run_in_executor``: ~10,000 calls/s here). Like any
synchronous code, a call run on the loop returns without letting other
tasks run. With ``inline=False`` every call goes to the executor.

    async with await AsyncMessageStore.open(path) as store:
        await store.put_message(Message("T", b"x"))
        r = await store.get_messages("T", 0, 0, wait_ms=5000)
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor

from ..config import ASYNC_FLUSH
from ..message import GetMessageResult, Message, MessageExt, PutMessageResult
from ..store import MessageStore

__all__ = ["AsyncMessageStore"]

_I64_MAX = (1 << 63) - 1


class AsyncMessageStore:
    """Awaitable wrapper of a :class:`MessageStore`; same arguments, same errors.

    Args:
        store (MessageStore): the store to wrap (closed by :meth:`close`).
        executor (concurrent.futures.Executor | None): where blocking calls run;
            None = the loop's default executor.
        inline (bool): run the calls that do not wait on the loop's thread
            (see the module docstring; default True). Such a call still
            blocks the loop while it faults in pages of a file that are not
            in memory (a cold read), as any mmap read does; False sends
            every call to the executor.
    """

    def __init__(self, store: MessageStore, executor: Executor | None = None, inline: bool = True):
        self.store = store
        self._executor = executor
        self.inline = bool(inline)

    @classmethod
    async def open(cls, root_dir, *args, executor: Executor | None = None, inline: bool = True,
                   **kwargs) -> AsyncMessageStore:
        """``MessageStore.open`` (recovery included) off the event loop."""
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(executor, functools.partial(MessageStore.open, root_dir, *args, **kwargs))
        return cls(store, executor, inline)

    async def _run(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def put_message(self, msg: Message) -> PutMessageResult:
        """``MessageStore.put_message``; on the loop's thread with ASYNC_FLUSH
        (*inline*), in the executor with SYNC_FLUSH (it waits for the disk)."""
        if self.inline and self.store.config.flush_disk_type == ASYNC_FLUSH:
            return self.store.put_message(msg)
        return await self._run(self.store.put_message, msg)

    async def put_messages(self, msgs) -> list:
        return await self._run(self.store.put_messages, list(msgs))

    async def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags=None,
                           wait_ms: int = 0) -> GetMessageResult:
        """``MessageStore.get_messages``; a pull that finds messages, or is not
        to wait, runs on the loop's thread (*inline*); one that is to wait for
        messages waits in an executor thread on the store's condition (no
        polling)."""
        if self.inline and type(wait_ms) is int and 0 <= wait_ms <= _I64_MAX:  # (else the store's method raises)
            r = self.store.get_messages(topic, queue_id, offset, max_count, tags)
            if r.messages or wait_ms == 0:
                return r
        return await self._run(self.store.get_messages, topic, queue_id, offset, max_count, tags, wait_ms)

    async def get_message(self, physical_offset: int) -> MessageExt | None:
        if self.inline:
            return self.store.get_message(physical_offset)
        return await self._run(self.store.get_message, physical_offset)

    async def query_messages(self, topic: str, key: str, *args) -> list:
        if self.inline:
            return self.store.query_messages(topic, key, *args)
        return await self._run(self.store.query_messages, topic, key, *args)

    async def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int,
                                          boundary: str = "lower") -> int:
        if self.inline:
            return self.store.get_offset_in_queue_by_time(topic, queue_id, timestamp, boundary)
        return await self._run(self.store.get_offset_in_queue_by_time, topic, queue_id, timestamp, boundary)

    async def flush(self) -> None:
        await self._run(self.store.flush)

    async def close(self) -> None:
        """Close the store; pending long polls return."""
        await self._run(self.store.close)

    async def __aenter__(self) -> AsyncMessageStore:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
