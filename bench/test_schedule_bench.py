"""A smoke run of ``bench/schedule.py`` (delayed delivery's throughput):
every delayed message is delivered once. The real run is the script itself."""

from __future__ import annotations

import json

import schedule


def test_delayed_puts_and_their_delivery(tmp_path):
    out = tmp_path / "s.json"
    assert schedule.main(["--messages", "3000", "--dir", str(tmp_path), "--json", str(out)]) == 0
    r = json.loads(out.read_text())
    assert r["messages"] == 3000
    assert r["plain_puts_per_s"] > 0 and r["delayed_puts_per_s"] > 0 and r["deliveries_per_s"] > 0
