"""``rmqstore spark <job>``: Spark jobs from the command line.

``rmqstore spark rebuild-cq <dir>`` and ``rmqstore spark rebuild-index <dir>``
(options ``--master URL``, ``--broker-conf broker.conf``, ``--on-corrupt
fail|skip|stop``) run :func:`rmqstore.spark.rebuild_consume_queues` /
:func:`rmqstore.spark.rebuild_index` on a SparkSession made from
``--master`` (default ``local[*]``; ``spark-submit`` settings apply too) and
print the job's report as JSON.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

__all__ = ["main", "session"]


def session(master: str = "local[*]", app_name: str = "rmqstore", conf: dict | None = None):
    """A SparkSession for rmqstore jobs: UTC, log level ERROR, the
    ``rmqstore`` format registered (:func:`rmqstore.spark.register`; filter
    pushdown as *conf* says, off by default), *conf* (Spark settings) applied;
    Spark's UI and console progress bar stay as Spark sets them (on). Python
    workers run this interpreter with rmqstore importable (``PYSPARK_PYTHON``,
    ``PYTHONPATH``), so a plain checkout works too."""
    os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
    if master.startswith("local"):
        os.environ.setdefault("SPARK_LOCAL_IP", "127.0.0.1")
    src = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    path = os.environ.get("PYTHONPATH", "")
    if src not in path.split(os.pathsep):
        os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (src, path) if p)
    from pyspark.sql import SparkSession

    from .source import register

    builder = (
        SparkSession.builder.master(master)
        .appName(app_name)
        .config("spark.sql.session.timeZone", "UTC")
    )
    for key, value in (conf or {}).items():
        builder = builder.config(key, value)
    spark = builder.getOrCreate()
    spark.sparkContext.setLogLevel("ERROR")
    register(spark)
    return spark


def main(argv=None) -> int:
    """Run ``rmqstore spark <job> ...``; returns the exit status (2, with one
    line on stderr, for a mistake in the arguments or a path that is not a
    store: checked before Spark starts)."""
    from ..arrow import ON_CORRUPT  # (the readers' choices, named once)
    from ..cli import UsageError, _broker_conf, _check_store, _config_arg, _fail, _Parser, _resolve_store

    p = _Parser(prog="rmqstore spark", description="Spark jobs over RocketMQ stores.")
    sub = p.add_subparsers(dest="job", required=True)
    for name, help_ in (
        ("rebuild-cq", "rebuild every ConsumeQueue from the CommitLog"),
        ("rebuild-index", "rebuild the IndexFiles from the CommitLog"),
    ):
        sp = sub.add_parser(name, help=help_, description=help_ + " (byte-identical to the store's own)")
        sp.add_argument("store", nargs="?", metavar="STORE",
                        help="store root directory (default: --broker-conf's storePathRootDir)")
        sp.add_argument("--master", default="local[*]", help="Spark master URL (default local[*])")
        sp.add_argument("--broker-conf", metavar="FILE", type=_broker_conf,
                        help="a broker's broker.conf: its storePathRootDir is the STORE when none is given; "
                             "delay levels, index geometry for a new index")
        sp.add_argument("--config", dest="broker_conf", type=_broker_conf, help=argparse.SUPPRESS)
        sp.add_argument("--on-corrupt", choices=ON_CORRUPT, default="fail",
                        help="at a damaged record: fail (default; run `rmqstore recover` first), skip it and "
                             "read on, or stop that split there; the report counts what was skipped")
    try:
        args = p.parse_args(argv)
        _resolve_store(args)
        _check_store(args.store)  # (a rebuild writes: never into a directory that is no store)
    except UsageError as e:
        return _fail(e.prog or "rmqstore spark", e)
    from ..cli import EXIT_DAMAGED, EXIT_USAGE
    from ..exceptions import CorruptedFileError, RmqStoreError
    from .rebuild import rebuild_consume_queues, rebuild_index

    config = _config_arg(args)
    from pyspark.sql import SparkSession

    owned = SparkSession.getActiveSession() is None  # a caller's session is left running
    spark = session(args.master, f"rmqstore {args.job}")
    try:
        job = rebuild_consume_queues if args.job == "rebuild-cq" else rebuild_index
        report = job(spark, args.store, config=config, on_corrupt=args.on_corrupt)
    except (RmqStoreError, FileNotFoundError) as e:
        print(f"rmqstore spark {args.job}: {e}", file=sys.stderr)
        return EXIT_DAMAGED if isinstance(e, CorruptedFileError) else EXIT_USAGE
    finally:
        if owned:
            spark.stop()
    print(json.dumps(report))
    return 0
