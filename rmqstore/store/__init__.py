"""MessageStore: lifecycle, recovery and dispatch over CommitLog, ConsumeQueues
and the IndexFile (RocketMQ ``DefaultMessageStore``, docs/recovery.md#dispatch,
docs/recovery.md#recovery).

Dispatch is synchronous: a message is in its ConsumeQueue and the index when
``put_message`` returns (under SYNC_FLUSH, once the record is on disk).

One class in layers, a module each, each layer a subclass of the one before
and calling only itself and the layers below it:

=============  ==============================================================
``base``       the state of an open store; the open and writable checks
``follow``     read-only follow mode: what a writer process did since
``space``      retention and disk space
``commit``     flushing, SYNC_FLUSH group commit, dispatch
``recovery``   load-time recovery
``put``        the put calls, through the core's Appender
``pull``       the read calls
``facade``     :class:`MessageStore`: open, close, consumer groups
=============  ==============================================================

``lock`` holds the writer lock (:class:`StoreLock`), ``args`` the argument
checks the calls share.
"""

from .facade import MessageStore
from .lock import StoreLock

__all__ = ["MessageStore", "StoreLock"]
