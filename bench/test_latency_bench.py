"""A smoke run of ``bench/latency.py`` (the put latency script): every mode
runs, the summaries hold what the README quotes, no put is lost. The real
run is the script itself (``python bench/latency.py``)."""

from __future__ import annotations

import json

import latency


def test_every_mode_runs_and_reports(tmp_path):
    out = tmp_path / "lat.json"
    assert latency.main(["--puts", "3000", "--segment-mb", "1", "--first-rounds", "1", "--settle-ms", "0",
                         "--dir", str(tmp_path), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) == set(latency.MODES)
    for s in report.values():
        assert s["puts"] == 3000
        assert s["rolls"] == 1  # 3000 records of ~420 B: one roll of a 1 MiB segment
        assert 0 < s["p50_us"] <= s["p99_us"] <= s["p99.9_us"] <= s["p99.99_us"] <= s["max_us"]
        assert len(s["first_put_of_store_ms"]) == 1 and len(s["first_put_of_queue_ms"]) == 1


def test_the_floor_runs_beside_a_mode(tmp_path):
    out = tmp_path / "lat.json"
    assert latency.main(["--mode", "ahead+warm", "--floor", "--puts", "2000", "--segment-mb", "1",
                         "--first-rounds", "1", "--settle-ms", "0", "--dir", str(tmp_path), "--json", str(out)]) == 0
    report = json.loads(out.read_text())
    assert set(report) == {"ahead+warm", "floor", "floor+io"}
    for name in ("floor", "floor+io"):
        s = report[name]
        assert s["puts"] == 2000 and s["rolls"] == 0
        assert 0 < s["p50_us"] <= s["p99_us"] <= s["max_us"]
        # each call as long as the mode's median put, at least
        assert s["p50_us"] >= report["ahead+warm"]["p50_us"] - 0.001
