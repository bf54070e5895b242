"""asyncio front for :class:`rmqstore.MessageStore`.

Every call runs the blocking store method in an executor thread, so the event
loop never blocks and long polls (``wait_ms``) wait on the store's condition,
not in a busy loop.

    async with await AsyncMessageStore.open(path) as store:
        await store.put_message(Message("T", b"x"))
        r = await store.get_messages("T", 0, 0, wait_ms=5000)
"""

from __future__ import annotations

import asyncio
import functools
from concurrent.futures import Executor

from .message import GetMessageResult, Message, MessageExt, PutMessageResult
from .store import MessageStore

__all__ = ["AsyncMessageStore"]


class AsyncMessageStore:
    """Awaitable wrapper of a :class:`MessageStore`; same arguments, same errors.

    Args:
        store (MessageStore): the store to wrap (closed by :meth:`close`).
        executor (concurrent.futures.Executor | None): where blocking calls run;
            None = the loop's default executor.
    """

    def __init__(self, store: MessageStore, executor: Executor | None = None):
        self.store = store
        self._executor = executor

    @classmethod
    async def open(cls, root_dir, *args, executor: Executor | None = None, **kwargs) -> "AsyncMessageStore":
        """``MessageStore.open`` (recovery included) off the event loop."""
        loop = asyncio.get_running_loop()
        store = await loop.run_in_executor(executor, functools.partial(MessageStore.open, root_dir, *args, **kwargs))
        return cls(store, executor)

    async def _run(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    async def put_message(self, msg: Message) -> PutMessageResult:
        return await self._run(self.store.put_message, msg)

    async def put_messages(self, msgs) -> list:
        return await self._run(self.store.put_messages, list(msgs))

    async def get_messages(self, topic: str, queue_id: int, offset: int, max_count: int = 32, tags=None,
                           wait_ms: int = 0) -> GetMessageResult:
        """``MessageStore.get_messages``; with *wait_ms* the wait happens in an
        executor thread on the store's condition (no polling)."""
        return await self._run(self.store.get_messages, topic, queue_id, offset, max_count, tags, wait_ms)

    async def get_message(self, physical_offset: int) -> MessageExt | None:
        return await self._run(self.store.get_message, physical_offset)

    async def query_messages(self, topic: str, key: str, *args) -> list:
        return await self._run(self.store.query_messages, topic, key, *args)

    async def get_offset_in_queue_by_time(self, topic: str, queue_id: int, timestamp: int,
                                          boundary: str = "lower") -> int:
        return await self._run(self.store.get_offset_in_queue_by_time, topic, queue_id, timestamp, boundary)

    async def flush(self) -> None:
        await self._run(self.store.flush)

    async def close(self) -> None:
        """Close the store; pending long polls return."""
        await self._run(self.store.close)

    async def __aenter__(self) -> "AsyncMessageStore":
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()
