"""The Spark data source and jobs (rmqstore.spark) on a real standalone cluster.

The module starts a Spark master and two workers (1 core, 1 GiB each) from the
pyspark package, once for the file, and runs the reads, a write and both
rebuild jobs with executors in other JVMs and Python workers started by
them: every result is compared with the store's own reads (rmqstore.arrow)
or with the files the store wrote. Where the machine allows it
(``unshare -Urm``), each worker runs in its own user + mount namespace with
its own disk mounted over one directory, as separate hosts would have:
reads there still work, and a job whose output the driver cannot see must
fail and leave the driver's store as it was.

Skipped when pyspark or Java is missing (``RMQSTORE_REQUIRE_SPARK=1``
makes that an error, as in test_spark.py) or with ``RMQSTORE_SPARK_CLUSTER=0``.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import pathlib
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request

import pytest

if os.environ.get("RMQSTORE_SPARK_CLUSTER", "1").strip().lower() in ("0", "false", "no", "off"):
    pytest.skip("RMQSTORE_SPARK_CLUSTER=0", allow_module_level=True)


from spark_support import require_spark

require_spark()

import pyarrow as pa  # noqa: E402
import pyarrow.compute as pc  # noqa: E402
import pyspark  # noqa: E402

from conftest import StepClock  # noqa: E402
from rmqstore import Message, MessageStore, StoreConfig, arrow  # noqa: E402
from test_spark import index_contents, tree  # noqa: E402

SPARK_HOME = os.path.dirname(os.path.abspath(pyspark.__file__))
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
HOST = "127.0.0.1"
PUSHDOWN = "spark.sql.python.filterPushdown.enabled"
START_DEADLINE = 60.0  # seconds for each start-up step (master, executors) before the fixture fails
# small files: several CommitLog files (and splits), ConsumeQueue and index files
SIZES = dict(
    mapped_file_size_commit_log=64 * 1024,
    mapped_file_size_consume_queue=64 * 20,
    max_hash_slot_num=64,
    max_index_num=400,
)
# a tiny cluster on a small machine: less JIT compiling and fewer GC threads
# (most of the file's CPU time is the JVMs warming up)
JAVA_OPTS = "-XX:TieredStopAtLevel=1 -XX:+UseSerialGC"
# each worker in its own user + mount namespace (a private mount of its own
# disk) and pid namespace (whatever the worker starts dies with it)
UNSHARE = ["unshare", "-Urm", "--propagation", "private", "--pid", "--fork", "--mount-proc"]


def _can_unshare() -> bool:
    if shutil.which("unshare") is None:
        return False
    try:
        return subprocess.run([*UNSHARE, "true"], stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                              stderr=subprocess.DEVNULL, timeout=20).returncode == 0
    except (OSError, subprocess.TimeoutExpired):
        return False


def _free_port() -> int:
    with socket.socket() as s:
        s.bind((HOST, 0))
        return s.getsockname()[1]


# --- the cluster ---------------------------------------------------------------------------------


class Cluster:
    """A standalone master and two workers, each process the leader of its own
    process group (teardown kills the groups). ``isolated`` is the directory
    each worker sees as its own disk (``disks[i]`` mounted over it), or None
    when the machine cannot make namespaces (the workers then share the disk)."""

    def __init__(self, root: pathlib.Path, isolate: bool):
        self.root = root
        self.isolated = root / "isolated" if isolate else None
        self.disks = [root / f"worker{i}-disk" for i in (1, 2)]
        self.procs: list = []
        self.logs: list = []
        self.port, self.webui = _free_port(), _free_port()
        self.url = f"spark://{HOST}:{self.port}"
        conf_dir = root / "conf"  # empty: no spark-defaults.conf of this machine applies
        conf_dir.mkdir()
        self.env = {**os.environ, "SPARK_HOME": SPARK_HOME, "SPARK_CONF_DIR": str(conf_dir),
                    "SPARK_LOCAL_IP": HOST, "SPARK_DAEMON_MEMORY": "256m",
                    "SPARK_DAEMON_JAVA_OPTS": JAVA_OPTS}

    def _start(self, name: str, cmd: list, env: dict) -> None:
        log = self.root / f"{name}.log"
        self.logs.append(log)
        with open(log, "wb") as out:
            self.procs.append(subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                               env=env, start_new_session=True))

    def state(self) -> dict | None:
        try:
            with urllib.request.urlopen(f"http://{HOST}:{self.webui}/json/", timeout=5) as r:
                return json.load(r)
        except (OSError, ValueError):
            return None

    def wait_for(self, what: str, ready) -> dict:
        """The master's state once *ready(state)*; RuntimeError naming
        *what*, with the logs, when a process exits or START_DEADLINE passes."""
        deadline = time.monotonic() + START_DEADLINE
        while True:
            st = self.state()
            if st is not None and ready(st):
                return st
            dead = [p.args for p in self.procs if p.poll() is not None]
            if dead or time.monotonic() > deadline:
                tails = "".join(f"\n--- {p.name}:\n{p.read_text(errors='replace')[-3000:]}" for p in self.logs)
                raise RuntimeError(f"standalone cluster: {what} ({'exited: ' + str(dead) if dead else 'timed out'})"
                                   f"{tails}")
            time.sleep(0.25)

    def start(self) -> None:
        """Start the master, and the workers once it is up (they register at
        once with a master that is up, else they retry seconds later); the
        spark fixture waits for the workers' executors."""
        spark_class = os.path.join(SPARK_HOME, "bin", "spark-class")
        self._start("master", [spark_class, "org.apache.spark.deploy.master.Master", "--host", HOST,
                               "--port", str(self.port), "--webui-port", str(self.webui)],
                    # (no REST submission server: it would take the fixed port 6066)
                    {**self.env, "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false"})
        self.wait_for("master did not come up", lambda st: True)
        if self.isolated is not None:
            self.isolated.mkdir()
        for i, disk in enumerate(self.disks, 1):
            disk.mkdir()
            home = self.root / f"worker{i}"
            (home / "local").mkdir(parents=True)
            cmd = [spark_class, "org.apache.spark.deploy.worker.Worker", "--host", HOST, "--cores", "1",
                   "--memory", "1g", "--webui-port", str(_free_port()), "--work-dir", str(home / "work"), self.url]
            if self.isolated is not None:
                cmd = [*UNSHARE, "sh", "-c", 'mount --bind "$1" "$2" && shift 2 && exec "$@"', "sh",
                       str(disk), str(self.isolated), *cmd]
            self._start(f"worker{i}", cmd, {**self.env, "SPARK_LOCAL_DIRS": str(home / "local")})

    def stop(self) -> None:
        for sig, grace in ((signal.SIGTERM, 15), (signal.SIGKILL, 15)):
            for p in reversed(self.procs):  # workers (and their executors) first
                if p.poll() is None:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(p.pid, sig)
            deadline = time.monotonic() + grace
            for p in self.procs:
                with contextlib.suppress(subprocess.TimeoutExpired):
                    p.wait(max(0.1, deadline - time.monotonic()))
            if all(p.poll() is not None for p in self.procs):
                break
        # (a worker's executors sit in its process group; its Python daemons
        # leave the group but die with the worker's pid namespace, or when
        # the executor closes their stdin)
        for p in self.procs:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(p.pid, signal.SIGKILL)


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    c = Cluster(tmp_path_factory.mktemp("cluster"), _can_unshare())
    try:
        c.start()  # (the driver starts while the workers do: the spark fixture waits for them)
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def spark(cluster):
    from pyspark import SparkContext
    from pyspark.sql import SparkSession

    from rmqstore.spark import register

    # getOrCreate would hand back a running session (test_spark.py's local[2]) whatever the master
    active = SparkSession.getActiveSession()
    if active is not None:
        active.stop()
    if SparkContext._active_spark_context is not None:
        SparkContext._active_spark_context.stop()
    # executors' Python: this interpreter, importing rmqstore from this checkout
    # (and this directory, for anything pickled by reference from the tests)
    pythonpath = os.pathsep.join([REPO, os.path.dirname(os.path.abspath(__file__))])
    builder = (
        SparkSession.builder.master(cluster.url).appName("rmqstore-standalone-tests")
        .config("spark.driver.host", HOST).config("spark.driver.bindAddress", HOST)
        .config("spark.driver.extraJavaOptions", JAVA_OPTS).config("spark.executor.extraJavaOptions", JAVA_OPTS)
        .config("spark.executor.memory", "512m").config("spark.executor.cores", "1").config("spark.cores.max", "2")
        # the first job waits until both executors are there (else it may run on one)
        .config("spark.scheduler.minRegisteredResourcesRatio", "1.0")
        .config("spark.scheduler.maxRegisteredResourcesWaitingTime", f"{int(START_DEADLINE)}s")
        .config("spark.executorEnv.PYTHONPATH", pythonpath)
        .config("spark.sql.session.timeZone", "UTC").config("spark.sql.shuffle.partitions", "2")
        .config("spark.ui.enabled", "false").config("spark.ui.showConsoleProgress", "false")
    )
    with pytest.MonkeyPatch.context() as mp:  # (read once, when the context starts)
        mp.setenv("PYSPARK_PYTHON", sys.executable)
        s = builder.getOrCreate()
    try:
        s.sparkContext.setLogLevel("ERROR")
        register(s)
        # a real cluster: one executor (one core) on each worker
        st = cluster.wait_for("the application did not get an executor on each worker",
                              lambda st: sorted(w.get("coresused") for w in st["workers"]) == [1, 1])
        assert [a["name"] for a in st["activeapps"]] == ["rmqstore-standalone-tests"]
        yield s
    finally:
        s.stop()


# --- stores and comparisons ----------------------------------------------------------------------


def make_store(root, count: int = 3000) -> None:
    """*count* varied messages: 4 topics x 4 queues, keys (one or several,
    some shared), tags, properties, unique keys, empty bodies, prepared and
    committed transaction records (no ConsumeQueue unit for the prepared)."""
    msgs = []
    for i in range(count):
        kw: dict = {"queue_id": i % 4, "born_timestamp": 1_726_732_800_000 + i * 997}
        if i % 5 != 4:
            kw["tags"] = f"Tag{i % 6}"
        if i % 3 == 0:
            kw["keys"] = f"order-{i}" if i % 2 else f"order-{i} customer-{i % 10}"
        if i % 2 == 0:
            kw["unique_key"] = f"U{i:08d}"
        if i % 7 == 1:
            kw["properties"] = {"region": f"r{i % 3}", "attempt": str(i % 4)}
        if i % 31 == 5:
            kw["sys_flag"] = 4  # prepared
        elif i % 31 == 6:
            kw["sys_flag"] = 8  # commit
        body = b"" if i % 19 == 0 else f"body-{i}-".encode() * (1 + i % 13)
        msgs.append(Message(("TopicA", "TopicB", "TopicC", "%RETRY%group")[i % 9 % 4], body, **kw))
    with MessageStore.open(root, config=StoreConfig(**SIZES), clock=StepClock(1_726_732_800_000, 1_500)) as st:
        for m in msgs:
            st.put_message(m)


@pytest.fixture(scope="module")
def store(tmp_path_factory):
    root = tmp_path_factory.mktemp("shared") / "broker-s" / "store"
    make_store(root)
    assert len(os.listdir(root / "commitlog")) > 5 and len(os.listdir(root / "index")) > 2
    return root


def table_of(df) -> pa.Table:
    """A Spark DataFrame as the Arrow table arrow.read_table gives, in CommitLog order."""
    t = df.toArrow()
    return t.cast(arrow.arrow_schema(t.column_names)).sort_by([("broker", "ascending"),
                                                                ("physical_offset", "ascending")])


def assert_same_table(got: pa.Table, want: pa.Table) -> None:
    assert got.column_names == want.column_names
    assert got.num_rows == want.num_rows
    for name in want.column_names:
        g, w = got.column(name).to_pylist(), want.column(name).to_pylist()
        if g != w:
            i = next(i for i, (a, b) in enumerate(zip(g, w)) if a != b)
            pytest.fail(f"column {name}, row {i}: {g[i]!r} != {w[i]!r}")


def snapshot(root) -> dict:
    """{relative path: sha256 of the file, or "dir"} of everything under *root*."""
    root = pathlib.Path(root)
    return {str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest() if p.is_file() else "dir"
            for p in sorted(root.rglob("*"))}


# --- on the cluster, shared disk -----------------------------------------------------------------


def test_executors_run_this_python_and_checkout(spark, cluster):
    """Tasks run on both workers, in this interpreter, with this checkout's
    rmqstore and the same kernels (RMQSTORE_PURE_PYTHON reaches them)."""
    import rmqstore

    def where(_):
        import rmqstore

        return os.getcwd(), sys.executable, rmqstore.__file__, rmqstore.IMPLEMENTATION

    got = set(spark.sparkContext.parallelize(range(8), 8).map(where).collect())
    # (an executor runs in its worker's work directory; the first round of tasks goes to both)
    homes = {pathlib.Path(cwd).relative_to(cluster.root).parts[0] for cwd, *_ in got}
    assert homes == {"worker1", "worker2"}
    assert {tuple(rest) for _, *rest in got} == {(sys.executable, rmqstore.__file__, rmqstore.IMPLEMENTATION)}


def test_read_equals_the_store(spark, store):
    files = sorted((store / "commitlog").iterdir())
    df = spark.read.format("rmqstore").option("splitBytes", max(f.stat().st_size for f in files)).load(str(store))
    assert df.rdd.getNumPartitions() == len(files)  # (one split per file: the tasks go to both workers)
    assert_same_table(table_of(df), arrow.read_table(str(store)).sort_by("physical_offset"))


@contextlib.contextmanager
def pushdown(spark):
    """Spark's filter pushdown for Python sources on meanwhile (register()
    leaves it as the session has it: off)."""
    spark.conf.set(PUSHDOWN, "true")
    try:
        yield
    finally:
        spark.conf.unset(PUSHDOWN)


def test_where_on_topic_and_keys(spark, store):
    """A WHERE on topic prunes and filters; one on keys is answered through
    the store's index (one task reads what it found): the rows are the
    store's own, filtered the same way, with pushdown on and off."""
    full = arrow.read_table(str(store)).sort_by("physical_offset")
    keys, topics = full["keys"].to_pylist(), full["topic"].to_pylist()
    # whole keys values: one key, and several (one of them shared by many records)
    single = next(k for k in keys if k and " " not in k)
    several = next(k for k, t in zip(keys, topics) if k and " " in k and t == "TopicA")
    cases = [
        ("topic = 'TopicB'", pc.equal(full["topic"], "TopicB")),
        (f"keys = '{single}'", pc.equal(full["keys"], single)),
        (f"keys IN ('{single}', '{several}', 'no-such-key')", pc.is_in(full["keys"], pa.array([single, several]))),
        (f"topic = 'TopicA' AND keys = '{several}'",
         pc.and_(pc.equal(full["topic"], "TopicA"), pc.equal(full["keys"], several))),
    ]
    # (a new DataFrame for each query: Spark keeps the partitions a pushdown planned on a DataFrame)
    with pushdown(spark):
        for where, mask in cases:
            want = full.filter(mask)
            assert want.num_rows > 0, where
            assert_same_table(table_of(spark.read.format("rmqstore").load(str(store)).where(where)), want)
            if "keys" in where:  # (the index lookup: one partition, not a scan)
                assert spark.read.format("rmqstore").load(str(store)).where(where).rdd.getNumPartitions() == 1
    where, mask = cases[-1]
    assert_same_table(table_of(spark.read.format("rmqstore").load(str(store)).where(where)), full.filter(mask))


def test_write_then_read_back(spark, store, tmp_path):
    cols = ["topic", "queue_id", "body", "keys", "tags", "properties", "unique_key"]
    out = tmp_path / "written" / "store"
    src = spark.read.format("rmqstore").load(str(store)).select(*cols)
    src.write.format("rmqstore").mode("overwrite").options(
        **{f"config.{k}": v for k, v in SIZES.items()}).save(str(out))
    got = arrow.read_table(str(out), columns=["physical_offset", *cols]).sort_by("physical_offset")
    want = arrow.read_table(str(store), columns=["physical_offset", *cols]).sort_by("physical_offset")
    # the rows were stored in the read's order (partition order: CommitLog order)
    assert_same_table(got.drop_columns(["physical_offset"]), want.drop_columns(["physical_offset"]))
    assert len(os.listdir(out / "commitlog")) > 5
    assert sorted(os.listdir(out.parent)) == ["store"]  # (no staging left beside it)


def test_rebuilds_are_byte_identical(spark, store, tmp_path):
    from rmqstore.spark import rebuild_consume_queues, rebuild_index

    root = tmp_path / "copy"
    shutil.copytree(store, root)
    # from nothing: the file sizes come from the config
    shutil.rmtree(root / "consumequeue")
    shutil.rmtree(root / "index")
    cq = rebuild_consume_queues(spark, root, config=StoreConfig(**SIZES))
    ix = rebuild_index(spark, root, config=StoreConfig(**SIZES))
    assert tree(root, "consumequeue") == tree(store, "consumequeue")
    assert index_contents(root) == index_contents(store)
    assert cq["queues"] == 16 and ix["files"] == len(os.listdir(store / "index"))
    assert cq["splits"] == ix["splits"] == len(os.listdir(store / "commitlog"))
    assert sorted(os.listdir(root)) == sorted(os.listdir(store))  # (no staging left)


# --- on the cluster, no shared disk --------------------------------------------------------------


@pytest.fixture
def replicate(cluster):
    """replicate(src, name): copy the store *src* to ``isolated/<name>`` on
    the driver's disk and on each worker's (what the executors see there)."""
    if cluster.isolated is None:
        pytest.skip(f"no namespaces here ({' '.join(UNSHARE)} true fails): the workers share the disk")
    made = []

    def copy(src, name: str) -> pathlib.Path:
        for base in (cluster.isolated, *cluster.disks):
            shutil.copytree(src, base / name)
            made.append(base / name.split("/")[0])
        return cluster.isolated / name

    yield copy
    for d in made:
        shutil.rmtree(d, ignore_errors=True)


def test_no_shared_disk_read_uses_each_workers_replica(spark, cluster, store, replicate):
    root = replicate(store, "read/broker-r/store")
    # what each executor sees at that path is its worker's disk, not the driver's
    for i, disk in enumerate(cluster.disks, 1):
        (disk / "read" / "who").write_text(f"worker{i}")
    (cluster.isolated / "read" / "who").write_text("driver")
    marker = str(cluster.isolated / "read" / "who")

    def who(_):
        with open(marker) as f:
            return f.read()

    # (the first round of tasks goes to both executors, one core each)
    assert set(spark.sparkContext.parallelize(range(8), 8).map(who).collect()) == {"worker1", "worker2"}
    df = spark.read.format("rmqstore").load(str(root))
    assert_same_table(table_of(df), arrow.read_table(str(root)).sort_by("physical_offset"))


@pytest.mark.parametrize("job", ["rebuild_consume_queues", "rebuild_index"])
def test_no_shared_disk_rebuild_fails_and_keeps_the_store(spark, store, replicate, job):
    """The executors write the new files on their own disks: the driver must
    not swap in what it cannot see (an empty or partial directory)."""
    import rmqstore.spark

    root = replicate(store, "rebuild/store")
    before = snapshot(root)
    from rmqstore.exceptions import OutputNotVisibleError

    with pytest.raises(OutputNotVisibleError, match="do not share this disk"):
        getattr(rmqstore.spark, job)(spark, root, config=StoreConfig(**SIZES))
    assert snapshot(root) == before  # (no staging directory left in it either)
    assert os.listdir(root.parent) == ["store"]


@pytest.mark.parametrize("mode", ["overwrite", "append"])
def test_no_shared_disk_write_fails_and_keeps_the_target(spark, store, replicate, mode):
    """The tasks stage their rows beside the target on their own disks: the
    commit on the driver must fail, not store nothing (or part) and succeed."""
    target = replicate(store, "write/store")
    before = snapshot(target)
    df = spark.read.format("rmqstore").load(str(store)).select("topic", "queue_id", "body")  # (shared disk)
    # (the commit runs in a Python worker: Spark hands its error on as text)
    with pytest.raises(Exception, match=r"OutputNotVisibleError(.|\n)*do not share this disk"):
        df.write.format("rmqstore").mode(mode).save(str(target))
    assert snapshot(target) == before
    assert os.listdir(target.parent) == ["store"]  # (no staging or new store left beside it)


def test_a_storage_uri_is_all_the_hosts_share(spark, store, s3_server, tmp_path):
    """The store on S3 (a test server), workers with their own disks where
    the machine allows: a read equals the store's, a write to S3 reads back
    the same messages, and both rebuilds of the S3 store write the local
    store's files."""
    from rmqstore.spark import rebuild_consume_queues, rebuild_index
    from rmqstore.storage import uri

    u = s3_server.uri("cluster/broker-s/store")
    uri.upload(str(store), u)
    assert_same_table(table_of(spark.read.format("rmqstore").load(u)), arrow.read_table(store))
    out = s3_server.uri("cluster/written")
    spark.read.format("rmqstore").load(u).write.format("rmqstore").mode("overwrite") \
        .options(**{"config." + k: v for k, v in SIZES.items()}).save(out)
    cols = ["topic", "queue_id", "body", "keys", "tags", "unique_key", "store_timestamp"]
    assert_same_table(table_of(spark.read.format("rmqstore").load(out)).select(cols),
                      arrow.read_table(store).select(cols))
    uri.delete_dir(uri.join(u, "consumequeue"))
    uri.delete_dir(uri.join(u, "index"))
    rebuild_consume_queues(spark, u, config=StoreConfig(**SIZES))
    rebuild_index(spark, u, config=StoreConfig(**SIZES))
    got = tmp_path / "got"
    uri.download(u, str(got))
    assert tree(got, "consumequeue") == tree(store, "consumequeue")
    assert index_contents(got) == index_contents(store)
    assert [n for n in os.listdir(got) if "rebuild" in n] == []  # (no staging left in the store
    assert [n for n, _d, _s in uri.list_dir(s3_server.uri("cluster")) if "rmqstore" in n] == []  # nor beside it)
