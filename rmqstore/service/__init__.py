"""The services above the store: ``offsets`` (consumer offsets, the broker's
``consumerOffset.json``), ``consumer`` (a pull consumer that commits what it
acknowledged), ``aio`` (the asyncio front) and ``retention`` (clean-up of
expired files and the disk-space decisions, docs/recovery.md#retention).
Each uses the store through its public methods.
"""
