"""Files made ahead: RocketMQ's AllocateMappedFileService and
``warmMappedFile`` (docs/format.md#files-made-ahead).

A writable store runs one :class:`AllocateService` thread that keeps the
files the next rolls take ready before a put needs them, so that a roll is
a switch to a file that exists, not a file creation on the put's path:

- the CommitLog always has its next segment made (a spare), as RocketMQ
  keeps it, and the one after once the last is half full (RocketMQ asks for
  the next file and the one after at a roll; made half a segment early, a
  round that comes late at a roll still finds one ready, and a small store
  keeps one spare, not two); an empty CommitLog has two, the file the first
  put writes and its spare, so that the first puts do not share the machine
  with a spare being made and warmed;
- each ConsumeQueue whose last file is half full has its next one made;
- the index has its next file made once its last one is half full, and
  the file a roll leaves behind is flushed here, not on the put;
- each file made is warmed (``warm_maped_file_enable``): its pages are
  faulted in writable with the GIL released, so the puts that later write
  there do not wait on page faults; under SYNC_FLUSH
  ``flush_least_pages_when_warm_maped_file`` pages at a time, each step
  synced as RocketMQ does (a group commit never has a warmed file to write
  back whole), under ASYNC_FLUSH in steps of up to 256 MiB (each step ends
  with a hand-over of the GIL, which the putting thread pays for);
- a warm-up step and the index sync a roll leaves here take the store's
  disk turn, which the flush thread holds while it syncs: the two never
  run at once, so that with the putting thread there are at most two busy
  threads of the store (on a 2-core machine a third preempted the putter
  for milliseconds).

Files are made with their final names (index files under temporary names
until a roll publishes them, as before) and reserved whole, so a file made
ahead but never used is an all-zero segment past the last record, which
recovery deletes as it deletes any segment past the end. A failure to make
one is logged and retried with a growing pause; the put that needs the file
then makes it itself, as it would without this service, and all-or-nothing
puts stay all or nothing.
"""

from __future__ import annotations

import logging
import threading

from .. import _kernels as k
from ..exceptions import StoreClosedError
from ..storage.mapped_file import PAGE, settle

__all__ = ["AllocateService"]

log = logging.getLogger("rmqstore.allocate")

#: how often the thread looks at the queues and the index, seconds (a
#: CommitLog roll wakes it at once). Each look takes the GIL from the
#: putting thread, which costs that put the time the operating system takes
#: to hand the GIL back (~0.1-0.2 ms on a VM): rarely is better
POLL = 0.5
#: the largest warm-up step under ASYNC_FLUSH (one call, the GIL released):
#: few steps, few hand-overs of the GIL; the stop waits for one step at most
WARM_STEP_ASYNC = 256 << 20
_MAX_PAUSE = 5.0


class AllocateService:
    """The thread that makes files ahead for one writable store.

    Args:
        lock: the store's append lock (puts, rolls and undos hold it).
        commit_log_queue (MappedFileQueue): the CommitLog's segments.
        index (IndexService | None): the index, or None when disabled.
        consume_queues (dict): the store's ConsumeQueues by (topic, queue id),
            read as they grow (a put adds to it under the append lock).
        warm (bool): warm each file made (``warm_maped_file_enable``).
        warm_pages (int): pages per warm-up step
            (``flush_least_pages_when_warm_maped_file``).
        sync_warm (bool): sync each warmed step (SYNC_FLUSH).
        name (str): for the thread's name.
        turn (threading.Lock): the store's disk turn (see the module's doc),
            held around each warm-up step and index sync.

    Attributes:
        failures (int): files it failed to make so far (each logged).
        made (int): files it made so far.
    """

    def __init__(self, lock, commit_log_queue, index, consume_queues, warm: bool, warm_pages: int, sync_warm: bool,
                 name: str, turn) -> None:
        self._lock = lock
        self._turn = turn
        self._cl = commit_log_queue
        self._index = index
        self._cqs = consume_queues
        self._warm = warm
        # SYNC_FLUSH: RocketMQ's step, synced; else as large as is quick to
        # stop (the pure twin's warm-up holds the GIL: RocketMQ's step there too)
        small = sync_warm or k.IMPLEMENTATION != "cython"
        self._step = max(1, warm_pages) * PAGE if small else WARM_STEP_ASYNC
        self._sync_warm = sync_warm
        self._name = name
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.failures = 0
        self.made = 0
        self._to_warm: list = []  # (file, mapping, from, to, sync, made here) not warmed yet
        # directories are made by the open only: the thread never makes one
        # again under a path the store may have left (renamed while open)
        self._make_dirs = True

    def start(self) -> None:
        """Make what is missing now (a new store's first CommitLog segment
        and index file: the first put does not wait for them), then start
        the thread, which warms them; the index leaves rolled files to it.
        A failure to make one is logged, and retried by the thread."""
        try:
            self.run_once(warm=False)
        except Exception as e:  # (the open goes on: the thread retries, a put makes what it needs)
            self.failures += 1
            log.warning("could not make a file ahead at open (retrying): %s", e)
        self._make_dirs = False
        if self._index is not None:
            self._index.rolled = []
        self._thread = threading.Thread(target=self._run, name=f"rmqstore-allocate:{self._name}", daemon=True)
        self._thread.start()

    def wake(self) -> None:
        """A roll took a file made ahead: make the next one now."""
        self._wake.set()

    def stop(self) -> None:
        """Stop the thread and wait for it (a warm-up stops between steps);
        the index flushes rolled files itself again."""
        self._stop.set()
        self._wake.set()
        t = self._thread
        if t is not None and t is not threading.current_thread():
            t.join()
        if self._index is not None and not self._index.rolled:
            self._index.rolled = None

    def _run(self) -> None:
        pause = 0.0
        self._wake.set()  # (a first round at once: the files the open made are not warm yet)
        while not self._stop.is_set():
            self._wake.wait(pause or POLL)
            self._wake.clear()
            if self._stop.is_set():
                return
            try:
                self._warm_made()  # (what the open made first)
                self.run_once()
                pause = 0.0
            except Exception as e:  # reported, retried; a put that needs the file makes it itself
                self.failures += 1
                pause = min(_MAX_PAUSE, max(POLL, pause * 2))
                log.warning("could not make a file ahead (retrying in %.1f s): %s", pause, e)

    def run_once(self, warm: bool = True) -> None:
        """One round: the CommitLog's next segments (each warmed as
        soon as made), the next file of each queue past half, the index's
        next file past half, the index files rolls left to flush; then the
        other files made are warmed. With *warm* False (the open) one
        CommitLog segment at most and no warming: the thread does the rest.
        Raises what making or flushing a file raises."""
        # the CommitLog first, made and warmed before anything else: every
        # put rolls into it, and at a roll every ~0.1 s (small segments) a
        # round that warms or flushes a large index file first would be late
        while self._ahead(self._cl, True) and warm:
            self._warm_made()
        self._adopt(self._cl.last)
        for cq in list(self._cqs.values()):  # (a snapshot: puts add queues meanwhile)
            if self._stop.is_set():
                return
            self._ahead(cq.queue, False)
            self._adopt(cq.queue.last)
        index = self._index
        if index is not None:
            self._ahead_index(index)
            if index.rolled or index.published:
                with self._turn:
                    index.flush_rolled()
        if warm:
            self._warm_made()

    def _warm_made(self) -> None:
        """Warm the files made since the last call (see the module's doc)."""
        while self._to_warm and not self._stop.is_set():
            self._warm_file(*self._to_warm.pop(0))

    def _ahead(self, q, always: bool) -> bool:
        """Make the next segment of *q* unless enough are made: for the
        CommitLog (*always*) the next, and the one after once the last is
        half full, so that a round that comes late at a roll still finds one
        ready (an empty one: its first two); for a queue one, once its last
        file is half full. Returns whether it made one."""
        if not self._wanted(q, always):  # (a look without the lock first: most rounds stop here)
            return False
        with self._lock:
            if not self._wanted(q, always):
                return False
            m = q.begin_ahead(q.covered_end(), self._spares(q, always))
        try:
            m.mf = q.create_segment(m.start, self._make_dirs)
        finally:
            m.done.set()  # (a put waiting for it takes it now, or makes its own)
            with self._lock:
                mf = q.end_ahead(m)
        self.made += 1
        if mf is not None:
            self._to_warm.append((mf, mf.mm, 0, mf.file_size, mf.sync, True))
        return True

    @staticmethod
    def _spares(q, always: bool) -> int:
        """How many spares *q* is to have now (see :meth:`_ahead`)."""
        last = q.last
        if last is None:  # (an empty CommitLog: its first spare is the file the first put writes)
            return 2 if always else 1
        return 2 if always and last.wrote_position >= last.file_size // 2 else 1

    @classmethod
    def _wanted(cls, q, always: bool) -> bool:
        if q.making is not None or q.file_size is None or q.read_only or len(q.spares) >= cls._spares(q, always):
            return False
        last = q.last
        if last is None:
            return always
        return always or last.wrote_position >= last.file_size // 2

    def _ahead_index(self, index) -> None:
        """The index's next file, once its last is half full (or it has none)."""
        if not self._index_wanted(index):
            return
        with self._lock:
            if not self._index_wanted(index):
                return
            name = index.new_spare_name()
        f = index.make_spare(name, self._make_dirs)
        with self._lock:
            kept = index.add_spare(f)
        self.made += 1
        if kept:
            self._to_warm.append((f, f.mm, 0, len(f.mm), f.flush_released, True))

    @staticmethod
    def _index_wanted(index) -> bool:
        if index.spares or index.read_only:
            return False
        last = index.files[-1] if index.files else None
        return last is None or last.index_count >= index.index_num // 2

    def _adopt(self, f) -> None:
        """Warm *f* too if a put made it itself and writes it now (a new
        queue's first file, or one made while this thread was late): from
        its write position on, its read-around left off until then, as the
        puts that write it meanwhile fault in a page at a time."""
        if f is None or not f.fresh or not self._warm or any(w[0] is f for w in self._to_warm):
            return
        start = f.wrote_position // PAGE * PAGE
        self._to_warm.append((f, f.mm, start, f.file_size, f.sync, False))

    def _warm_file(self, f, mm, pos: int, size: int, sync, made: bool) -> None:
        """Warm bytes [*pos*, *size*) of *f* (mapped as *mm*) a step at a
        time (see the module's doc); stops when the store stops or the file
        is closed (a roll's undo, clean-up). A file this thread *made* gets
        its read-around back first (faulted in twice as fast; no put writes
        it yet), one it adopted once warm."""
        if not self._warm:
            return
        if made:
            settle(f)
        while pos < size and not self._stop.is_set():
            end = min(size, pos + self._step)
            try:
                with self._turn:
                    k.warm_pages(mm, pos, end)
                    if self._sync_warm:
                        sync()
            except (ValueError, BufferError, OSError, StoreClosedError):
                return  # closed or deleted meanwhile: nothing left to warm
            pos = end
        if not made and pos >= size:
            settle(f)
