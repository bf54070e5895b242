"""A smoke run of ``bench/group.py`` (consumer-group throughput across
processes): one and two members drain the store, every message delivered
once between them. The real run is the script itself."""

from __future__ import annotations

import json

import group


def test_one_and_two_members_drain_the_store(tmp_path):
    out = tmp_path / "g.json"
    assert group.main(["--messages", "2000", "--members", "1", "2", "--deferred", "--dir", str(tmp_path),
                       "--json", str(out)]) == 0
    results = json.loads(out.read_text())
    assert [r["members"] for r in results] == [1, 2]
    for r in results:
        assert r["delivered"] == r["messages"] == 2000 and r["msgs_per_s"] > 0
        assert len(r["per_member"]) == r["members"]
