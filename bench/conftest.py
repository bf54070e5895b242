"""Benchmark fixtures: both kernel implementations in one run, a prebuilt store,
and a summary of Cython/pure-Python ratios at the end."""

import os
import sys

import pytest

# the kernel switch is a test helper (tests/kernel_switch.py), shared with bench/peers.py
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), os.pardir, "tests"))

from benchdata import CONFIG, N, make_messages
from kernel_switch import select
from rmqstore import MessageStore


def _have_core():
    try:
        from rmqstore import _core  # noqa: F401
    except ImportError:
        return False
    return True


IMPLS = ["cython", "python"]


@pytest.fixture(params=IMPLS)
def impl(request):
    if request.param == "cython" and not _have_core():
        pytest.skip("Cython core not built")
    previous = select(request.param)
    yield request.param
    select(previous)


@pytest.fixture(scope="session")
def filled_store(tmp_path_factory):
    """A store of N messages written once (with the live implementation) and
    reopened read-only by each benchmark; the clock advances 1 ms per message."""
    path = tmp_path_factory.mktemp("bench") / "store"
    t = iter(range(1_700_000_000_000, 1_700_000_000_000 + 10 * N))
    results = []
    with MessageStore.open(path, config=CONFIG, clock=lambda: next(t)) as s:
        msgs = make_messages()
        for i in range(0, N, 1000):
            results.extend(s.put_messages(msgs[i : i + 1000]))
    return path, results


def pytest_terminal_summary(terminalreporter, exitstatus, config):
    bs = getattr(config, "_benchmarksession", None)
    if bs is None or not bs.benchmarks:
        return
    groups = {}
    for b in bs.benchmarks:
        impl = b.params.get("impl") if b.params else None
        if impl and b.stats:
            groups.setdefault(b.group or b.name, {})[impl] = b
    lines = []
    for group, by in sorted(groups.items()):
        if "cython" in by and "python" in by:
            c, p = by["cython"].stats.median, by["python"].stats.median
            ops = by["cython"].extra_info.get("ops", 1)
            lines.append(
                f"{group:<16} cython {ops / c:>12,.0f}/s   python {ops / p:>12,.0f}/s   ratio {p / c:5.1f}x"
            )
    if lines:
        terminalreporter.write_sep("-", "rmqstore: Cython core vs pure Python (medians; ops per second)")
        for line in lines:
            terminalreporter.write_line(line)


class _PeersSummary:
    """The table of bench/test_peers.py (every store and workload, and the
    ratio of rmqstore-cython to each store), printed last, after
    pytest-benchmark's own tables."""

    @pytest.hookimpl(trylast=True)
    def pytest_terminal_summary(self, terminalreporter, config):
        bs = getattr(config, "_benchmarksession", None)
        if bs is None or not bs.benchmarks:
            return
        from peers import summary_lines

        lines = summary_lines(bs.benchmarks)
        if lines:
            terminalreporter.write_sep("-", "rmqstore beside its peers (bench/test_peers.py; ops per second)")
            for line in lines:
                terminalreporter.write_line(line)


def pytest_configure(config):
    config.pluginmanager.register(_PeersSummary(), "rmqstore-bench-peers-summary")
