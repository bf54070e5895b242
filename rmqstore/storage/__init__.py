"""The store's files, one module per kind: ``mapped_file`` (fixed-size mapped
segments and queues of them, the file helpers: no-follow opens, allocation,
directory fsync), ``consumequeue`` (ConsumeQueue files), ``index`` (IndexFile
and the index service), ``checkpoint`` (the checkpoint file) and ``walker``
(the one read-only walker of store files that the store, the tools,
``rmqstore.arrow`` and ``rmqstore.spark`` share) and ``uri`` (store files
named by ``s3://``, ``hdfs://``... URIs, through pyarrow.fs). The CommitLog is
``rmqstore/commitlog.py``.
"""
