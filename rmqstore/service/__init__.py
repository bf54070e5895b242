"""The services above the store: ``offsets`` (consumer offsets, the broker's
``consumerOffset.json``, shared by processes), ``consumer`` (a pull consumer
that commits what it acknowledged), ``group`` (consumer-group membership and
queue leases across processes), ``aio`` (the asyncio front), ``allocate``
(files made ahead) and ``retention`` (clean-up of expired files and the
disk-space decisions, docs/recovery.md#retention).

The first four use the store through its public methods and its arrival
signal (``_wait_until``, ``_wake_waiters``: a wait for units any of several
queues may get); ``allocate`` and ``retention`` run inside the store, under
its locks.
"""
