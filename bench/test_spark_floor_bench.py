"""A smoke run of ``bench/spark_floor.py`` (the Python data source's floor
beside Parquet): both queries run and agree with Parquet on a few rows. The
real run is the script itself (``python bench/spark_floor.py``)."""

from __future__ import annotations

import os

from spark_support import require_spark

require_spark()

import spark_floor  # noqa: E402


def test_both_queries_run_and_agree_with_parquet(tmp_path, capsys):
    assert spark_floor.main(["--rows", "20000", "--rounds", "1", "--parts", "3", "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "20,000 rows in 3 partitions" in out
    assert "count()" in out and "groupBy(topic, hour)" in out
    assert os.listdir(tmp_path) == []  # the Parquet copy removed
