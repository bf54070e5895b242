"""asyncio front for :class:`rmqstore.MessageStore`: every public method and
attribute of the store, awaitable.

Calls that wait by design run the store method in an executor thread: a long
poll (``wait_ms``) that finds nothing waits there on the store's condition,
not in a busy loop, and so do SYNC_FLUSH puts (they wait for the disk),
batches, commits, ``flush``, clean-up, ``open`` and ``close``. The others (a
pull that finds messages, lookups, an ASYNC_FLUSH put) take about a
microsecond and run on the loop's thread, because a hop to a thread and back
costs ~100 µs on a small machine (``run_in_executor``: ~10,000 calls/s
here). Like any synchronous code, a call run on the loop returns without
letting other tasks run. With ``inline=False`` every call goes to the
executor.

    async with AsyncMessageStore.open(path) as store:
        await store.put_message(Message("T", b"x"))
        r = await store.get_messages("T", 0, 0, wait_ms=5000)
        async for msg in store.consumer("G", "T", wait_ms=math.inf):
            ...

Cancellation: a cancelled call that runs in the executor cannot stop the
thread mid-call; the call completes there (a put is stored, a commit is
made) and what it opened is closed (a cancelled ``open``). A cancelled wait
(a consumer's, between messages) ends its thread's wait at once and leaves
nothing in flight.
"""

from __future__ import annotations

import asyncio
import functools
import threading
import time
from collections.abc import Callable, Coroutine
from concurrent.futures import Executor
from typing import Any

from ..config import SYNC_FLUSH
from ..message import GetMessageResult, Message, PutMessageResult
from ..store import MessageStore
from .consumer import Consumer

__all__ = ["AsyncConsumer", "AsyncMessageStore"]

_I64_MAX = (1 << 63) - 1

def _awaitable(name: str, quick: bool) -> Callable[..., Coroutine[Any, Any, Any]]:
    """An awaitable method calling the store's *name* (the bound method of
    the open store: a gate may stand in for the class's method)."""
    method = getattr(MessageStore, name)
    if quick:
        async def call(self, *args, **kwargs):
            if self.inline:
                return getattr(self.store, name)(*args, **kwargs)
            return await self._run(getattr(self.store, name), *args, **kwargs)
    else:
        async def call(self, *args, **kwargs):
            return await self._run(getattr(self.store, name), *args, **kwargs)
    functools.update_wrapper(call, method)  # (name, signature and docstring: the store's)
    where = "on the loop's thread when inline" if quick else "in the executor"
    call.__doc__ = f"Awaitable :meth:`MessageStore.{name}`, run {where}.\n\n{method.__doc__ or ''}"
    return call


def _attribute(name: str) -> Any:
    return property(lambda self: getattr(self.store, name), doc=f"The store's ``{name}``.")


class _Opening:
    """What :meth:`AsyncMessageStore.open` returns: await it for the store,
    or enter it with ``async with`` (the store is closed on leaving)."""

    __slots__ = ("_open", "_store")

    def __init__(self, open_):
        self._open = open_
        self._store = None

    def __await__(self):
        return self._open().__await__()

    async def __aenter__(self) -> AsyncMessageStore:
        self._store = await self._open()
        return self._store

    async def __aexit__(self, *exc) -> None:
        store, self._store = self._store, None
        if store is not None:
            await store.close()


class AsyncMessageStore:
    """Awaitable wrapper of a :class:`MessageStore`: the same methods (each a
    coroutine, except :meth:`consumer` and :meth:`iter_messages`, which
    return async iterators), the same attributes, arguments and errors.

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
    def open(cls, root_dir, *args, executor: Executor | None = None, inline: bool = True, **kwargs) -> _Opening:
        """``MessageStore.open`` (recovery included) off the event loop:
        ``async with AsyncMessageStore.open(path) as store`` closes the store
        on leaving; ``store = await AsyncMessageStore.open(path)`` leaves the
        closing to the caller. Same arguments and errors as
        :meth:`MessageStore.open`. An open whose caller is cancelled closes
        the store once the open completes in its thread (no lock is left
        held)."""

        async def open_() -> AsyncMessageStore:
            # a cancelled caller leaves the open running in its thread: the
            # thread closes the store itself, or the caller does if the open
            # was done already (the loop may be gone by the time it ends)
            guard = threading.Lock()
            state: dict = {}

            def open_in_thread():
                store = MessageStore.open(root_dir, *args, **kwargs)
                with guard:
                    state["store"] = store
                    abandoned = state.get("cancelled", False)
                if abandoned:
                    store.close()
                return store

            fut = asyncio.get_running_loop().run_in_executor(executor, open_in_thread)
            try:
                store = await asyncio.shield(fut)
            except asyncio.CancelledError:
                with guard:
                    state["cancelled"] = True
                    opened = state.get("store")
                if opened is not None:
                    opened.close()
                raise
            return cls(store, executor, inline)

        return _Opening(open_)

    async def _run(self, fn, *args, **kwargs):
        loop = asyncio.get_running_loop()
        return await loop.run_in_executor(self._executor, functools.partial(fn, *args, **kwargs))

    # calls that take microseconds: on the loop's thread when inline
    check_message = _awaitable("check_message", True)
    consume_queue = _awaitable("consume_queue", True)
    consumer_offsets = _awaitable("consumer_offsets", True)
    get_committed_offset = _awaitable("get_committed_offset", True)
    get_max_offset_in_queue = _awaitable("get_max_offset_in_queue", True)
    get_message = _awaitable("get_message", True)
    get_message_columns = _awaitable("get_message_columns", True)
    get_message_views = _awaitable("get_message_views", True)
    get_min_offset_in_queue = _awaitable("get_min_offset_in_queue", True)
    get_offset_in_queue_by_time = _awaitable("get_offset_in_queue_by_time", True)
    look_message_by_msg_id = _awaitable("look_message_by_msg_id", True)
    query_messages = _awaitable("query_messages", True)
    query_offsets = _awaitable("query_offsets", True)
    queues = _awaitable("queues", True)
    # calls that may wait for the disk, a lock or a long scan: in the executor
    check_disk_space = _awaitable("check_disk_space", False)
    check_messages = _awaitable("check_messages", False)
    commit_offset = _awaitable("commit_offset", False)
    delete_expired = _awaitable("delete_expired", False)
    flush = _awaitable("flush", False)
    put_message_columns = _awaitable("put_message_columns", False)
    refresh = _awaitable("refresh", False)
    run_maintenance = _awaitable("run_maintenance", False)
    # the store's attributes, read as they are (nothing waits)
    checkpoint = _attribute("checkpoint")
    closed = _attribute("closed")
    commitlog = _attribute("commitlog")
    config = _attribute("config")
    disk_full = _attribute("disk_full")
    index = _attribute("index")
    last_exit_ok = _attribute("last_exit_ok")
    max_physical_offset = _attribute("max_physical_offset")
    min_physical_offset = _attribute("min_physical_offset")
    read_only = _attribute("read_only")
    recovery_report = _attribute("recovery_report")
    root_dir = _attribute("root_dir")

    async def put_message(self, msg: Message) -> PutMessageResult:
        """``MessageStore.put_message``; on the loop's thread with ASYNC_FLUSH
        or NO_FLUSH (*inline*), in the executor with SYNC_FLUSH (it waits for
        the disk)."""
        if self.inline and self.store.config.flush_disk_type != SYNC_FLUSH:
            return self.store.put_message(msg)
        return await self._run(self.store.put_message, msg)

    async def put_messages(self, msgs) -> list:
        """``MessageStore.put_messages`` in the executor; *msgs* (any
        iterable of Message) is read on the loop's thread first."""
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

    def consumer(self, group: str, topic: str, queue_ids=None, batch: int = 32, tags=None, sync=None,
                 wait_ms=None, max_reconsume_times: int = 16) -> AsyncConsumer:
        """``MessageStore.consumer`` as an :class:`AsyncConsumer`:
        ``async for msg in store.consumer(group, topic, wait_ms=...)``. Same
        arguments, errors and delivery contract (raised here, at once)."""
        return AsyncConsumer(self, self.store.consumer(group, topic, queue_ids, batch, tags, sync, wait_ms,
                                                       max_reconsume_times))

    def iter_messages(self, start_offset: int = 0) -> _AsyncMessages:
        """``MessageStore.iter_messages`` as an async iterator (``async for``);
        each message is read on the loop's thread when inline, else in the
        executor. Raises as the store's method does."""
        return _AsyncMessages(self, self.store.iter_messages(start_offset))

    async def close(self) -> None:
        """Close the store; pending long polls and waiting consumers return."""
        await self._run(self.store.close)

    async def __aenter__(self) -> AsyncMessageStore:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self):
        mode = "inline" if self.inline else "executor"
        return f"<AsyncMessageStore {self.store.root_dir!r} {self._state()} {mode}>"

    def _state(self) -> str:
        s = self.store
        return ("read-only" if s.read_only else "read-write") + (" closed" if s.closed else "")


class _AsyncMessages:
    """The async iterator :meth:`AsyncMessageStore.iter_messages` returns."""

    def __init__(self, front: AsyncMessageStore, it):
        self._front = front
        self._it = it

    def __aiter__(self):
        return self

    async def __anext__(self):
        if self._front.inline:
            m = next(self._it, None)
        else:
            m = await self._front._run(next, self._it, None)
        if m is None:
            raise StopAsyncIteration
        return m


class AsyncConsumer:
    """A :class:`~rmqstore.service.consumer.Consumer` for ``async for``:
    the same delivery contract (a message is in flight until the next one is
    asked for; asking commits it), the same waiting (*wait_ms*).

    Pulls run on the loop's thread when the store is inline (else in the
    executor); a commit that is to be on disk (the consumer's *sync*) and
    the wait for new messages run in the executor. A task cancelled while
    it waits ends that wait; cancelled while a pull or a commit runs in a
    thread, that completes there, a message it took goes back to be handed
    out next, and the consumer's next step waits for that thread first:
    nothing is skipped, nothing is in flight that was not handed out.

    Attributes:
        consumer (Consumer): the synchronous consumer it drives (positions,
            committed offsets, in-flight message, ``delivered``).
    """

    def __init__(self, front: AsyncMessageStore, consumer: Consumer):
        self._front = front
        self.consumer = consumer
        # each commit on disk before the next message (the consumer's *sync*)
        self._sync = consumer._offsets.sync if consumer.sync is None else bool(consumer.sync)
        self._busy: asyncio.Future | None = None  # the last call sent to a thread
        self._closing = False  # close() was called: a waiting step ends

    def __aiter__(self):
        return self

    async def __anext__(self):
        c, front = self.consumer, self._front
        await self._settle()
        if c.closed or front.store.closed:
            c._ensure_open()  # raises
        c._ack_inflight()
        await self._commit()
        wait_ms = c.wait_ms
        deadline = None if wait_ms is None else time.monotonic() + wait_ms / 1000
        while True:
            if c._rebalance_due():  # (a look at the group's members: files, and a flush when a queue goes)
                await self._call(c._rebalance)
            m = c._step() if front.inline else await self._call(c._step, undo=c._put_back)
            if m is not None:
                c._deliver(m)
                return m
            left = -1.0 if deadline is None else deadline - time.monotonic()
            if left > 0:
                await self._wait(c._wait_slice(left))
            ended = self._closing or c.closed or front.store.closed
            if left <= 0 or ended:
                if not ended:
                    await self._commit()  # (progress over filtered-out messages)
                raise StopAsyncIteration

    async def _commit(self) -> None:
        """Commit what is acknowledged: in memory here, on disk in the
        executor when the consumer's commits are synchronous."""
        c = self.consumer
        if c._commit_acked(defer=True) and self._sync:
            await self._call(c._offsets.flush)

    async def _wait(self, timeout: float) -> bool:
        """Wait in the executor until a queue may have something (see
        :meth:`Consumer._ready`); a cancellation ends the thread's wait."""
        c, store = self.consumer, self._front.store
        cancelled = False

        def ready() -> bool:
            return cancelled or self._closing or c._ready()

        try:
            return await self._call(store._wait_until, ready, timeout)
        except asyncio.CancelledError:
            cancelled = True
            store._wake_waiters()
            raise

    async def _call(self, fn, *args, undo=None):
        """*fn(*args)* in the executor, to completion even when the caller is
        cancelled; then *undo(result)* puts back what it took."""
        await self._settle()
        fut = asyncio.get_running_loop().run_in_executor(self._front._executor, functools.partial(fn, *args))
        self._busy = fut
        try:
            return await asyncio.shield(fut)
        except asyncio.CancelledError:
            if undo is not None:
                fut.add_done_callback(lambda f: f.cancelled() or f.exception() is not None or undo(f.result()))
            raise

    async def _settle(self) -> None:
        """Wait for a call a cancelled step left running in a thread (its
        undo runs first): one thread at a time drives the consumer."""
        fut = self._busy
        if fut is not None and not fut.done():
            try:
                await asyncio.shield(fut)
            except asyncio.CancelledError:
                raise
            except Exception:  # (its own caller was cancelled: its outcome is nobody's)
                pass

    async def reconsume_later(self, msg, delay_level: int = 0):
        """:meth:`Consumer.reconsume_later` (a put), in the executor."""
        return await self._call(self.consumer.reconsume_later, msg, delay_level)

    async def commit(self) -> None:
        """:meth:`Consumer.commit`, in the executor."""
        await self._call(self.consumer.commit)

    async def close(self) -> None:
        """:meth:`Consumer.close` (commits what is acknowledged), in the
        executor; a task waiting in ``async for`` on this consumer ends its
        loop (StopAsyncIteration) first."""
        self._closing = True
        self._front.store._wake_waiters()  # (its thread's wait sees _closing and returns)
        await self._call(self.consumer.close)

    async def __aenter__(self) -> AsyncConsumer:
        return self

    async def __aexit__(self, *exc) -> None:
        await self.close()

    def __repr__(self):
        return f"<AsyncConsumer of {self.consumer!r}>"
