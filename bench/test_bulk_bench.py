"""Bulk kernels over one CommitLog file: the recovery walk (``scan_records``,
with and without CRC checks) and columnar decoding (``decode_columns``, the
reader under rmqstore.arrow / the Spark data source), Cython core vs pure.

Size knob: RMQSTORE_BENCH_SCAN_MB (CommitLog megabytes, default 64).
``extra_info["bytes"]`` holds the bytes walked, so ``--benchmark-json`` gives GB/s.
"""

import mmap
import os

import pytest

from benchdata import make_messages
from rmqstore import MessageStore, StoreConfig, _kernels
from rmqstore.format.layout import STOP_LIMIT

SCAN_MB = int(os.environ.get("RMQSTORE_BENCH_SCAN_MB", "64"))
BATCH = 8192  # records per decode_columns call: big enough to amortise, small enough for the cache


@pytest.fixture(scope="module")
def commitlog_file(tmp_path_factory):
    """One CommitLog file of SCAN_MB megabytes of 256-byte messages, mapped read-only."""
    root = tmp_path_factory.mktemp("bulk") / "store"
    size = SCAN_MB * 1024 * 1024
    cfg = StoreConfig(mapped_file_size_commit_log=size, message_index_enable=False)
    batch = make_messages(1000)
    with MessageStore.open(root, config=cfg) as s:
        while s.max_physical_offset < size - 1000 * 600:
            s.put_messages(batch)
        end = s.max_physical_offset
    path = root / "commitlog" / "00000000000000000000"
    with open(path, "rb") as fh:
        mm = mmap.mmap(fh.fileno(), 0, prot=mmap.PROT_READ)
    records = _kernels.scan_records(mm, 0, len(mm), 0, False, 0, 1 << 22)[2]
    yield mm, end, records
    mm.close()


@pytest.mark.parametrize("check_crc", [True, False], ids=["crc", "no-crc"])
def test_scan(benchmark, impl, commitlog_file, check_crc):
    mm, end, records = commitlog_file
    benchmark.group = "scan-crc" if check_crc else "scan"
    benchmark.extra_info.update(ops=records, bytes=end)

    def run():
        assert _kernels.scan_records(mm, 0, len(mm), 0, check_crc, 2, 1 << 22)[:1] == (end,)

    benchmark.pedantic(run, rounds=3)


@pytest.mark.parametrize("narrow", [False, True], ids=["full", "narrow"])
def test_decode_columns(benchmark, impl, commitlog_file, narrow):
    mm, end, records = commitlog_file
    benchmark.group = "decode-columns-narrow" if narrow else "decode-columns"
    benchmark.extra_info.update(ops=records, bytes=end)
    _kernels.decode_columns(mm, 0, len(mm), 0, 1, True, True)  # numpy's import is not the kernel

    def run():
        pos, n = 0, 0
        while True:
            pos, stop, cols = _kernels.decode_columns(mm, pos, len(mm), 0, BATCH, not narrow, not narrow)
            n += len(cols["queue_id"])
            if stop != STOP_LIMIT:
                break
        assert (pos, n) == (end, records)

    benchmark.pedantic(run, rounds=3)
