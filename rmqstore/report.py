"""``rmqstore report``: a picture of a store in one file.

:func:`write_report` reads a store (read-only, so beside a live writer too) and
writes one self-contained HTML page (inline SVG charts, no script, nothing
fetched) or one PNG with four panels: messages and bytes per topic over time,
messages per queue, consumer lag, and the store's files with the disk that
holds them. The charts need matplotlib (``pip install 'rmqstore[report]'``).

The time series come from a walk of every ConsumeQueue, one file's units at a
time as a numpy view, with each unit's store timestamp read from the mapped
CommitLog by one kernel call per segment: no Python object per message, and memory bounded
by one chunk of units and the series (at most 11 rows: the 10 biggest topics
and the rest).
"""

from __future__ import annotations

import html
import io
import os
import re
import secrets
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from . import _kernels as k
from .cli import _show  # (paths shown as the command line shows them)
from .exceptions import CorruptedFileError
from .format.layout import CQ_STORE_UNIT_SIZE, CQ_UNIT_FIELDS, PRE_BLANK_SIZE

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure, SubFigure

__all__ = ["write_report", "FORMATS"]

#: output file suffixes (lower case) and the format each one selects
FORMATS = {".html": "html", ".htm": "html", ".png": "png"}
#: topics drawn one line each in the time chart; the others are summed as "(other)"
TOP_TOPICS = 10
OTHER = "(other)"
#: bars in the queue and lag charts (the tables list every row)
MAX_BARS = 30
#: automatic bucket sizes (ms), smallest first: the first one giving at most AUTO_BUCKETS buckets is used
BUCKET_LADDER_MS = (
    1_000, 5_000, 15_000, 60_000, 5 * 60_000, 15 * 60_000, 3_600_000, 6 * 3_600_000, 86_400_000, 7 * 86_400_000,
)
AUTO_BUCKETS = 120
#: most buckets an explicit bucket_ms may give (each is a point of up to 11 lines)
MAX_BUCKETS = 20_000
#: ConsumeQueue units read per step (20 bytes each; the gathers take ~100 bytes per unit)
CHUNK_UNITS = 65_536

_NAMES = {1_000: "second", 60_000: "minute", 3_600_000: "hour", 86_400_000: "day", 7 * 86_400_000: "week"}


# --- scanning -----------------------------------------------------------------------


@dataclass
class _Scan:
    """What the ConsumeQueue walk found (numbers are ints; arrays numpy int64)."""

    topics: dict  # topic -> {"messages", "bytes", "first_store_time", "last_store_time"}, biggest first
    queues: list  # {"topic", "queue_id", "min_offset", "max_offset", "messages"} in store.queues() order
    rows: list  # the series' row names: up to TOP_TOPICS topics, then OTHER when there are more topics
    bucket_ms: int
    start_ms: int  # start of the first bucket, ms since epoch (a multiple of bucket_ms)
    messages: Any = None  # (len(rows), buckets) messages per bucket
    nbytes: Any = None  # (len(rows), buckets) bytes (record sizes) per bucket
    undated: int = 0  # units whose record (and so its store time) is not in the CommitLog
    out_of_range: int = 0  # dated units outside the estimated time range, counted in the edge buckets

    @property
    def buckets(self) -> int:
        return 0 if self.messages is None else int(self.messages.shape[1])


def _unit_dtype():
    import numpy as np

    dt = np.dtype(CQ_UNIT_FIELDS)
    assert dt.itemsize == CQ_STORE_UNIT_SIZE
    return dt


def _store_timestamps(view: tuple, phy, size):
    """STORETIMESTAMP of the records at physical offsets *phy* (int64 array)
    of sizes *size*, through ``CommitLog.segment_view()`` *view*: what
    ``consumequeue.view_time`` answers per unit, one kernel call
    (``read_store_timestamps``) per segment. -1 where ``[phy, phy + size)``
    is not stored or the field lies outside its segment."""
    import numpy as np

    bufs, fs, base, lo, hi = view
    out = np.full(phy.shape, -1, dtype=np.int64)
    ok = (phy >= lo) & (phy + size <= hi) & (phy >= base)
    seg = np.where(ok, (phy - base) // fs, -1)
    ok &= seg < len(bufs)
    sel_all = np.flatnonzero(ok)
    if sel_all.size == 0:
        return out
    segs = seg[sel_all]
    # one call per segment the units point into (a chunk of one queue spans few)
    order = np.argsort(segs, kind="stable")
    cuts = np.flatnonzero(np.diff(segs[order])) + 1
    for grp in np.split(order, cuts):
        i = int(segs[grp[0]])
        sel = sel_all[grp]
        pos = np.ascontiguousarray(phy[sel] - (base + i * fs), dtype=np.int64)
        ts = np.empty(pos.size, dtype=np.int64)
        k.read_store_timestamps(bufs[i], pos.data, ts.data)
        out[sel] = ts
    return out


def _check_bucket(bucket_ms) -> None:
    if bucket_ms is not None and (isinstance(bucket_ms, bool) or not isinstance(bucket_ms, int) or bucket_ms <= 0):
        raise ValueError(f"bucket_ms must be a positive int (ms), got {bucket_ms!r}")


def _pick_bucket(t0: int, t1: int, bucket_ms: int | None) -> int:
    _check_bucket(bucket_ms)
    if bucket_ms is not None:
        n = t1 // bucket_ms - t0 // bucket_ms + 1
        if n > MAX_BUCKETS:
            raise ValueError(f"bucket_ms={bucket_ms} gives {n} time buckets over the store's time span "
                             f"({t1 - t0} ms); at most {MAX_BUCKETS}")
        return bucket_ms
    for b in BUCKET_LADDER_MS:
        if t1 // b - t0 // b + 1 <= AUTO_BUCKETS:
            return b
    day = 86_400_000  # (a span of years: whole days)
    return -(-(t1 - t0 + 1) // (AUTO_BUCKETS - 1) // day) * day or day


def _scan(store, bucket_ms: int | None = None, progress: Callable[[int, int], Any] | None = None) -> _Scan:
    """Walk every ConsumeQueue of open *store*: messages and bytes per topic
    and per time bucket (see :func:`write_report` for *bucket_ms* and
    *progress*). The time range is estimated first from each queue's first
    and last messages and the CommitLog's first record; a store time outside
    it (a clock that went back) is counted in the nearest edge bucket and in
    ``out_of_range``."""
    import numpy as np

    cl = store.commitlog
    view = cl.segment_view()
    queues = []
    per_topic: dict = {}
    t0 = t1 = None
    for topic, qid in store.queues():
        cq = store.consume_queue(topic, qid)
        mn, mx = cq.min_offset_in_queue(), cq.max_offset_in_queue()
        queues.append({"topic": topic, "queue_id": qid, "min_offset": mn, "max_offset": mx, "messages": mx - mn})
        per_topic[topic] = per_topic.get(topic, 0) + (mx - mn)
        for off in ((mn, mx - 1) if mx > mn else ()):
            u = cq.get_unit(off)
            ts = cl.store_timestamp_at(u[0], u[1]) if u else -1
            if ts >= 0:
                t0 = ts if t0 is None else min(t0, ts)
                t1 = ts if t1 is None else max(t1, ts)
    if cl.queue.files:
        ts = cl.first_record_timestamp(0)  # (the oldest record: one header read)
        if ts >= 0 and t0 is not None:
            t0 = min(t0, ts)
    names = sorted(per_topic, key=lambda t: (-per_topic[t], t))
    rows = names[:TOP_TOPICS] + ([OTHER] if len(names) > TOP_TOPICS else [])
    row_of = {t: min(i, TOP_TOPICS) for i, t in enumerate(names)}
    if t0 is None or t1 is None:
        t0 = t1 = 0  # (no dated message: an empty series; only bucket_ms is checked)
        b = _pick_bucket(t0, t1, bucket_ms)
        nb = 0
    else:
        b = _pick_bucket(t0, t1, bucket_ms)
        nb = t1 // b - t0 // b + 1
    start = t0 // b * b
    msgs = np.zeros((len(rows), nb), dtype=np.int64)
    nbytes = np.zeros((len(rows), nb), dtype=np.int64)
    topics = {t: {"messages": per_topic[t], "bytes": 0, "first_store_time": None, "last_store_time": None}
              for t in names}
    scan = _Scan(topics, queues, rows, b, start, msgs, nbytes)
    dt = _unit_dtype()
    total = max(0, store.max_physical_offset - store.min_physical_offset)
    done = 0
    for q in queues:
        cq = store.consume_queue(q["topic"], q["queue_id"])
        row = row_of[q["topic"]]
        acc = topics[q["topic"]]
        off, mx = q["min_offset"], q["max_offset"]
        while off < mx:
            where = cq.unit_range(off, min(CHUNK_UNITS, mx - off))
            if where is None or where[2] <= where[1]:
                break  # (units the queue does not hold after all: no bytes, no times)
            buf, a, z = where
            units = np.frombuffer(buf, dtype=dt, count=(z - a) // CQ_STORE_UNIT_SIZE, offset=a)
            phy = units["phy"].astype(np.int64)
            size = units["size"].astype(np.int64)
            del units  # (copied: the mapping is not kept exported)
            off += phy.size
            real = ~((phy == 0) & (size == PRE_BLANK_SIZE))  # (placeholders below a queue's first entry)
            if not real.all():
                phy, size = phy[real], size[real]
            chunk_bytes = int(size.sum())
            acc["bytes"] += chunk_bytes
            ts = _store_timestamps(view, phy, size)
            dated = ts >= 0
            scan.undated += int(phy.size - np.count_nonzero(dated))
            if not dated.all():
                ts, size = ts[dated], size[dated]
            if ts.size and nb:
                lo, hi = int(ts.min()), int(ts.max())
                if acc["first_store_time"] is None or lo < acc["first_store_time"]:
                    acc["first_store_time"] = lo
                if acc["last_store_time"] is None or hi > acc["last_store_time"]:
                    acc["last_store_time"] = hi
                idx = (ts - start) // b
                outside = (idx < 0) | (idx >= nb)
                if outside.any():
                    scan.out_of_range += int(np.count_nonzero(outside))
                    np.clip(idx, 0, nb - 1, out=idx)
                msgs[row] += np.bincount(idx, minlength=nb)
                # float64 weights are exact: a chunk's bytes stay far below 2**53
                nbytes[row] += np.rint(np.bincount(idx, weights=size, minlength=nb)).astype(np.int64)
            if progress is not None:
                done += chunk_bytes
                progress(min(done, total), total)
    if progress is not None:
        progress(total, total)
    return scan


# --- files and disk -------------------------------------------------------------------


def _file_row(path: str) -> dict:
    """``{"name", "path", "bytes", "allocated"}``: size, and bytes the file system allocated (sparse files less)."""
    try:
        st = os.stat(path)
    except OSError:  # (deleted meanwhile by a writer's clean-up)
        return {"name": os.path.basename(path), "path": path, "bytes": 0, "allocated": 0}
    blocks = getattr(st, "st_blocks", None)
    return {"name": os.path.basename(path), "path": path, "bytes": st.st_size,
            "allocated": st.st_size if blocks is None else blocks * 512}


def _files(store) -> tuple:
    """``(totals, commitlog_rows)``: totals per kind ``{"count", "bytes", "allocated"}``
    and one row per CommitLog file (``_file_row`` plus ``from_offset``, ``written``)."""
    cl_rows = []
    for mf in store.commitlog.queue.files:
        r = _file_row(mf.path)
        r["from_offset"], r["written"] = mf.file_from_offset, mf.wrote_position
        cl_rows.append(r)
    cq_rows = [_file_row(mf.path) for t, q in store.queues() for mf in store.consume_queue(t, q).queue.files]
    ix_rows = [_file_row(f.path) for f in store.index.files]
    totals = {}
    for kind, rows in (("commitlog", cl_rows), ("consumequeue", cq_rows), ("index", ix_rows)):
        totals[kind] = {"count": len(rows), "bytes": sum(r["bytes"] for r in rows),
                        "allocated": sum(r["allocated"] for r in rows)}
    return totals, cl_rows


# --- text -------------------------------------------------------------------------------


def _ts(ms) -> str:
    if ms is None or ms < 0:
        return "-"
    return datetime.fromtimestamp(ms / 1000, timezone.utc).isoformat(timespec="milliseconds")


def _human(n: float) -> str:
    """Bytes as text in decimal units (``512 B``, ``1.5 kB``, ``2 GB``): chart ticks fall on round numbers."""
    n = float(n)
    for unit in ("B", "kB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.3g} {unit}"
        n /= 1000
    return ""  # pragma: no cover - (unreachable: TB ends the loop)


def _bucket_text(ms: int) -> str:
    for unit in sorted(_NAMES, reverse=True):
        if ms % unit == 0:
            n = ms // unit
            return f"1 {_NAMES[unit]}" if n == 1 else f"{n} {_NAMES[unit]}s"
    return f"{ms} ms"


def _e(s) -> str:
    """Store-supplied text for HTML: escaped, lone surrogates (a group name
    from JSON) as escapes so the page encodes."""
    return html.escape(str(s).encode("utf-8", "backslashreplace").decode("utf-8"))


def _label(s: str, width: int = 40) -> str:
    """Store-supplied text for a chart label: matplotlib reads ``$...$`` as
    math and hides legend labels starting with ``_``; long names are cut."""
    s = str(s).encode("utf-8", "backslashreplace").decode("utf-8")
    if len(s) > width:
        s = s[: width - 1] + "\u2026"
    s = s.replace("$", r"\$")
    return " " + s if s.startswith("_") else s


# --- charts -----------------------------------------------------------------------------


def _bytes_axis(ax: Axes, axis: str = "y") -> None:
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    a = ax.yaxis if axis == "y" else ax.xaxis
    a.set_major_formatter(FuncFormatter(lambda v, _pos: _human(v)))
    a.set_major_locator(MaxNLocator(nbins=5 if axis == "x" else "auto"))


def _empty(ax: Axes, text: str) -> None:
    ax.text(0.5, 0.5, text, ha="center", va="center", transform=ax.transAxes, color="0.4")
    ax.set_xticks([])
    ax.set_yticks([])


def _draw_time(fig: Figure | SubFigure, scan: _Scan) -> None:
    import numpy as np
    from matplotlib.dates import AutoDateLocator, ConciseDateFormatter
    from matplotlib.ticker import MaxNLocator

    ax_m, ax_b = fig.subplots(2, 1, sharex=True)
    if not scan.buckets or not scan.messages.any():
        _empty(ax_m, "no dated messages")
        _empty(ax_b, "")
        return
    x = (scan.start_ms + scan.bucket_ms * np.arange(scan.buckets)).astype("datetime64[ms]")
    marker = "o" if scan.buckets <= 30 else None
    for i, name in enumerate(scan.rows):
        ax_m.plot(x, scan.messages[i], label=_label(name), marker=marker, markersize=3, linewidth=1.2)
        ax_b.plot(x, scan.nbytes[i], marker=marker, markersize=3, linewidth=1.2)
    per = _bucket_text(scan.bucket_ms)
    ax_m.set_ylabel(f"messages / {per}")
    ax_m.yaxis.set_major_locator(MaxNLocator(integer=True))
    ax_b.set_ylabel(f"bytes / {per}")
    _bytes_axis(ax_b)
    loc = AutoDateLocator()
    ax_b.xaxis.set_major_locator(loc)
    ax_b.xaxis.set_major_formatter(ConciseDateFormatter(loc))
    ax_b.set_xlabel("store time (UTC)")
    ax_m.set_title("messages and bytes per topic over time")
    ax_m.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.01, 1.0))
    for ax in (ax_m, ax_b):
        ax.grid(True, alpha=0.3)
        ax.set_ylim(bottom=0)


def _barh(ax: Axes, labels: list, values: list, title: str, xlabel: str, empty: str) -> None:
    from matplotlib.ticker import MaxNLocator

    if not labels:
        _empty(ax, empty)
        ax.set_title(title)
        return
    y = list(range(len(labels)))
    ax.barh(y, values, color="C0")
    ax.set_yticks(y, [_label(s) for s in labels], fontsize="small")
    ax.invert_yaxis()  # (the biggest on top)
    ax.set_xlabel(xlabel)
    ax.xaxis.set_major_locator(MaxNLocator(integer=True))
    ax.set_title(title)
    ax.grid(True, axis="x", alpha=0.3)


def _top(pairs: list) -> list:
    return sorted(pairs, key=lambda p: -p[1])[:MAX_BARS]


def _draw_queues(ax: Axes, queues: list) -> None:
    top = _top([(f"{q['topic']}/{q['queue_id']}", q["messages"]) for q in queues])
    title = "messages per queue" + (f" (the {MAX_BARS} biggest of {len(queues)})" if len(queues) > MAX_BARS else "")
    _barh(ax, [p[0] for p in top], [p[1] for p in top], title, "messages", "no queues")


def _lag_pairs(groups: list) -> list:
    lag: dict = {}
    for r in groups:
        key = f"{r['group']} / {r['topic']}"
        lag[key] = lag.get(key, 0) + r["lag"]
    return list(lag.items())


def _draw_lag(ax: Axes, groups: list) -> None:
    pairs = _lag_pairs(groups)
    top = _top(pairs)
    title = "consumer lag per group / topic" + (
        f" (the {MAX_BARS} biggest of {len(pairs)})" if len(pairs) > MAX_BARS else "")
    _barh(ax, [p[0] for p in top], [p[1] for p in top], title, "messages behind",
          "no consumer group has committed an offset")


def _draw_files(fig: Figure | SubFigure, files: dict, disk: dict) -> None:
    ax_k, ax_d = fig.subplots(1, 2)
    kinds = ["commitlog", "consumequeue", "index"]
    y = list(range(len(kinds)))
    ax_k.barh([v - 0.2 for v in y], [files[k]["bytes"] for k in kinds], height=0.4, label="size", color="C0")
    ax_k.barh([v + 0.2 for v in y], [files[k]["allocated"] for k in kinds], height=0.4, label="on disk",
              color="C1")
    ax_k.set_yticks(y, [f"{k} ({files[k]['count']})" for k in kinds])
    ax_k.invert_yaxis()
    _bytes_axis(ax_k, "x")
    ax_k.legend(fontsize="small")
    ax_k.set_title("store files (count): size and bytes on disk")
    ax_k.grid(True, axis="x", alpha=0.3)
    store = sum(files[k]["allocated"] for k in kinds)
    parts = [
        ("store", min(store, disk["used"]), "C0"),
        ("other used", max(0, disk["used"] - store), "0.6"),
        # (blocks reserved for root and the like: neither used nor free to the store)
        ("reserved", max(0, disk["total"] - disk["used"] - disk["free"]), "0.85"),
        ("free", disk["free"], "C2"),
    ]
    left = 0
    for name, v, color in parts:
        ax_d.barh([0], [v], left=left, color=color, label=f"{name}: {_human(v)}")
        left += v
    ax_d.set_yticks([])
    _bytes_axis(ax_d, "x")
    ax_d.set_title(f"file system holding the store: {_human(disk['total'])}")
    ax_d.legend(fontsize="small", loc="upper center", bbox_to_anchor=(0.5, -0.25), ncol=2)


def _figure(width: float, height: float) -> Figure:
    from matplotlib.figure import Figure

    return Figure(figsize=(width, height), layout="constrained")


def _bar_height(n: int) -> float:
    return 1.2 + 0.22 * max(1, min(n, MAX_BARS))


def _svg(fig: Figure, name: str) -> str:
    """*fig* as an ``<svg>`` element for an HTML page. Its ids are renamed
    ``<name>-<n>``: every chart of a page numbers its elements from 1 and
    hashes clip paths with a random salt, so ids would repeat across charts
    and change from run to run. Comments (matplotlib writes each text in
    one) are dropped."""
    buf = io.StringIO()
    fig.savefig(buf, format="svg", metadata={"Date": None})
    text = buf.getvalue()
    text = text[text.index("<svg"):]  # (no XML declaration or doctype inside HTML)
    # (matplotlib breaks up "--" in a comment's text, so the first "-->" ends it)
    text = re.sub(r"<!--.*?-->\n?", "", text, flags=re.S)
    ids: dict = {}
    for m in re.finditer(r'\bid="([^"]+)"', text):
        ids.setdefault(m.group(1), f"{name}-{len(ids) + 1}")

    def ref(m: re.Match) -> str:
        return m.group(1) + ids.get(m.group(2), m.group(2)) + m.group(3)

    text = re.sub(r'(\bid="|href="#)([^"]+)(")', ref, text)
    return re.sub(r"(url\(#)([^)]+)(\))", ref, text)


# --- the two formats -----------------------------------------------------------------------

_CSS = """
body { font-family: system-ui, sans-serif; margin: 2em; color: #222; max-width: 1200px; }
h1 { font-size: 1.5em; } h2 { font-size: 1.2em; margin-top: 2em; border-bottom: 1px solid #ccc; }
table { border-collapse: collapse; margin: 1em 0; font-size: 0.9em; }
th, td { border: 1px solid #ddd; padding: 0.2em 0.6em; text-align: left; }
td.num, th.num { text-align: right; font-variant-numeric: tabular-nums; }
tr:nth-child(even) td { background: #f7f7f7; }
svg { max-width: 100%; height: auto; }
code { background: #f3f3f3; padding: 0 0.2em; }
.note { color: #555; }
"""


def _table(headers: list, rows: list, css_id: str) -> str:
    """An HTML table; *headers* are (text, numeric); cells of *rows* are
    ready HTML (escaped by the caller)."""
    num = [n for _h, n in headers]
    head = "".join(f'<th{" class=num" if n else ""}>{h}</th>' for h, n in headers)
    body = "\n".join(
        "<tr>" + "".join(f'<td{" class=num" if num[i] else ""}>{c}</td>' for i, c in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f'<table id="{css_id}">\n<thead><tr>{head}</tr></thead>\n<tbody>\n{body}\n</tbody>\n</table>'


def _size_cell(n: int) -> str:
    return f'<span title="{n} bytes">{_human(n)}</span>'


def _html(summary: dict, scan: _Scan, cl_rows: list, root: str, generated_ms: int) -> str:
    from . import IMPLEMENTATION, __version__

    files, disk, groups = summary["files"], summary["disk"], summary["groups"]
    n_msgs = sum(t["messages"] for t in scan.topics.values())
    parts = [
        "<!DOCTYPE html>",
        '<html lang="en">',
        '<head><meta charset="utf-8">',
        f'<meta name="generator" content="rmqstore {_e(__version__)}">',
        f"<title>rmqstore report: {_e(root)}</title>",
        f"<style>{_CSS}</style></head>",
        "<body>",
        "<h1>RocketMQ store report</h1>",
        f"<p>Store <code>{_e(root)}</code>, generated {_e(_ts(generated_ms))} by rmqstore {_e(__version__)} "
        f"({_e(IMPLEMENTATION)}).</p>",
        f"<p>{n_msgs} message(s) in {len(scan.topics)} topic(s) and {len(scan.queues)} queue(s).</p>",
    ]

    # messages and bytes per topic over time
    parts.append('<section id="topics-over-time">\n<h2>Messages and bytes per topic over time</h2>')
    if scan.buckets:
        other = f"; the other {len(scan.topics) - TOP_TOPICS} topics summed as {_e(OTHER)}" \
            if OTHER in scan.rows else ""
        parts.append(f'<p class="note">{scan.buckets} bucket(s) of {_e(_bucket_text(scan.bucket_ms))} from '
                     f"{_e(_ts(scan.start_ms))} (store time, UTC){other}.</p>")
    notes = []
    if scan.undated:
        notes.append(f"{scan.undated} message(s) whose record is no longer in the CommitLog have no store time "
                     "and are left out of the chart")
    if scan.out_of_range:
        notes.append(f"{scan.out_of_range} message(s) stored at a time outside the range of the queues' first "
                     "and last messages are counted in the first or last bucket")
    if notes:
        parts.append(f'<p class="note">{_e("; ".join(notes))}.</p>')
    fig = _figure(11, 6)
    _draw_time(fig, scan)
    parts.append(_svg(fig, "time"))
    parts.append(_table(
        [("topic", False), ("messages", True), ("bytes", True), ("first store time", False),
         ("last store time", False)],
        [[_e(t), str(v["messages"]), _size_cell(v["bytes"]), _e(_ts(v["first_store_time"])),
          _e(_ts(v["last_store_time"]))] for t, v in scan.topics.items()],
        "topics-table",
    ))
    parts.append("</section>")

    # queue sizes
    parts.append('<section id="queue-sizes">\n<h2>Messages per queue</h2>')
    fig = _figure(11, _bar_height(len(scan.queues)))
    _draw_queues(fig.subplots(), scan.queues)
    parts.append(_svg(fig, "queues"))
    parts.append(_table(
        [("topic", False), ("queue", True), ("min offset", True), ("max offset", True), ("messages", True)],
        [[_e(q["topic"]), str(q["queue_id"]), str(q["min_offset"]), str(q["max_offset"]), str(q["messages"])]
         for q in scan.queues],
        "queues-table",
    ))
    parts.append("</section>")

    # consumer lag
    parts.append('<section id="consumer-lag">\n<h2>Consumer lag</h2>')
    if summary.get("groups_error"):
        parts.append(f'<p class="note">consumer offsets not read: {_e(summary["groups_error"])}</p>')
    if not groups:
        parts.append("<p>no consumer group has committed an offset</p>")
    else:
        fig = _figure(11, _bar_height(len(_lag_pairs(groups))))
        _draw_lag(fig.subplots(), groups)
        parts.append(_svg(fig, "lag"))
        parts.append(_table(
            [("group", False), ("topic", False), ("queue", True), ("committed", True), ("max offset", True),
             ("lag", True), ("first unconsumed", False), ("lag time (s)", True), ("retry", True),
             ("dead letters", True)],
            [[_e(r["group"]), _e(r["topic"]), str(r["queue_id"]), str(r["committed_offset"]), str(r["max_offset"]),
              str(r["lag"]), _e(_ts(r["first_unconsumed_store_time"])), f"{r['lag_ms'] / 1000:.1f}",
              str(r["retry_messages"]), str(r["dead_letters"])] for r in groups],
            "lag-table",
        ))
    parts.append("</section>")

    # files and disk
    parts.append('<section id="store-files">\n<h2>Store files and disk</h2>')
    fig = _figure(11, 2.8)
    _draw_files(fig, files, disk)
    parts.append(_svg(fig, "files"))
    rows = [[k, str(files[k]["count"]), _size_cell(files[k]["bytes"]), _size_cell(files[k]["allocated"])]
            for k in ("commitlog", "consumequeue", "index")]
    parts.append(_table([("files", False), ("count", True), ("size", True), ("on disk", True)], rows,
                        "files-table"))
    parts.append(f"<p>File system holding the store: {_size_cell(disk['total'])} in all, "
                 f"{_size_cell(disk['used'])} used, {_size_cell(disk['free'])} free.</p>")
    parts.append(_table(
        [("CommitLog file", False), ("first offset", True), ("size", True), ("written", True), ("on disk", True)],
        [[_e(r["name"]), str(r["from_offset"]), _size_cell(r["bytes"]), _size_cell(r["written"]),
          _size_cell(r["allocated"])] for r in cl_rows],
        "commitlog-table",
    ))
    parts.append("</section>\n</body>\n</html>\n")
    return "\n".join(parts)


def _png(summary: dict, scan: _Scan, root: str, generated_ms: int) -> bytes:
    groups = summary["groups"]
    n_bars = min(max(len(scan.queues), 1), MAX_BARS), min(max(len(_lag_pairs(groups)), 1), MAX_BARS)
    heights = [6.0, _bar_height(n_bars[0]), _bar_height(n_bars[1]), 2.8]
    fig = _figure(12, sum(heights) + 0.6)
    shown = root if len(root) <= 90 else "\u2026" + root[-89:]  # (a long path: its end names the store)
    fig.suptitle(f"rmqstore report: {_label(shown, 90)}  ({_ts(generated_ms)})", fontsize="medium")
    grid = fig.add_gridspec(4, 1, height_ratios=heights)
    sf = [fig.add_subfigure(grid[i]) for i in range(4)]
    _draw_time(sf[0], scan)
    _draw_queues(sf[1].subplots(), scan.queues)
    _draw_lag(sf[2].subplots(), groups)
    _draw_files(sf[3], summary["files"], summary["disk"])
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, metadata={"Software": "rmqstore"})
    return buf.getvalue()


def _write_atomically(out_path: str, data: bytes) -> None:
    """Write *data* to a new file beside *out_path*, then rename it over
    *out_path*: readers see the old file or the whole new one, and a failure
    leaves no partial file (the temporary one is removed)."""
    d = os.path.dirname(out_path) or "."
    tmp = os.path.join(d, f".{os.path.basename(out_path)}.{secrets.token_hex(4)}.tmp")
    # (0o666 less the umask, as a plain open() would give the report)
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, out_path)
    except BaseException:
        try:
            os.unlink(tmp)
        except OSError:
            pass
        raise


# --- entry point ---------------------------------------------------------------------------------


def write_report(
    store_dir,
    out_path,
    *,
    bucket_ms: int | None = None,
    now_ms: int | None = None,
    progress: Callable[[int, int], Any] | None = None,
) -> dict:
    """Write a report of the store in *store_dir* to *out_path*.

    The store is opened read-only (no lock, nothing written to it; a live
    writer may go on beside). The report shows messages and bytes per topic
    over time (store time, UTC; the 10 topics with the most messages one
    line each, the rest summed as ``(other)``), messages per queue, each
    consumer group's lag (:func:`rmqstore.service.progress.consumer_progress`),
    and the store's files with the disk use of the file system holding it.

    Args:
        store_dir (str | PathLike): the store root (``commitlog/``, ``consumequeue/``, ...).
        out_path (str | PathLike): the report file; its suffix picks the
            format: ``.html`` (or ``.htm``): one self-contained page, charts
            as inline SVG, no script; ``.png``: one image with four panels.
            Written to a temporary file in the same directory, then renamed
            over *out_path*: a failure leaves no partial file.
        bucket_ms (int | None): width of the time buckets in ms; None picks
            one of 1 s, 5 s, 15 s, 1 min, 5 min, 15 min, 1 h, 6 h, 1 day, 1 week,
            the smallest that gives at most 120 buckets over the store's time span.
        now_ms (int | None): ms since epoch the consumer lag times are
            measured to and the report is dated by; default the wall clock.
        progress (callable | None): ``progress(done_bytes, total_bytes)``,
            called after each step of the scan: bytes of the messages counted
            so far (capped at the total) out of the CommitLog's stored bytes;
            the last call has ``done_bytes == total_bytes``.

    Returns:
        dict (JSON-serialisable): ``output`` (*out_path* as str), ``format``
        (``"html"`` or ``"png"``), ``topics`` (``{topic: {"messages",
        "bytes"}}``, most messages first; bytes are the records' sizes),
        ``queues`` (``[{"topic", "queue_id", "min_offset", "max_offset",
        "messages"}]`` sorted by topic and queue), ``groups`` (the rows of
        ``consumer_progress``), ``files`` (``{"commitlog" | "consumequeue" |
        "index": {"count", "bytes", "allocated"}}``: files, their sizes and
        the bytes allocated on disk), ``disk`` (``{"total", "used", "free"}``
        bytes of the file system holding the store), ``time_buckets`` (number
        of buckets, 0 without dated messages), ``bucket_ms``, ``start_ms``
        (start of the first bucket), ``undated`` (messages whose record is gone
        from the CommitLog: in the counts, not in the time chart) and
        ``out_of_range`` (messages stored outside the time range that the
        queues' first and last messages span: counted in the edge buckets).

    Raises:
        ValueError: *out_path* has another suffix (checked before anything is
            read), or *bucket_ms* is not a positive int or gives more than
            20000 buckets.
        ImportError: matplotlib is not installed (``pip install 'rmqstore[report]'``).
        FileNotFoundError: no store directory at *store_dir*, or no directory for *out_path*.
        CorruptedFileError: a store file does not match its format (an
            offsets file that does not parse is noted in the report instead).
        OSError: the report could not be written.
    """
    out = os.fspath(out_path)
    suffix = os.path.splitext(out)[1].lower()
    fmt = FORMATS.get(suffix)
    if fmt is None:
        raise ValueError(f"unsupported report file suffix {suffix or '(none)'!r} in {_show(out)}: "
                         f"use one of {', '.join(sorted(FORMATS))}")
    _check_bucket(bucket_ms)
    try:
        import matplotlib  # noqa: F401
    except ImportError as e:
        raise ImportError(f"the report's charts need matplotlib: pip install 'rmqstore[report]' ({e})") from e
    from .store import MessageStore

    generated = int(time.time() * 1000) if now_ms is None else now_ms
    with MessageStore.open(store_dir, read_only=True) as store:
        scan = _scan(store, bucket_ms, progress)
        groups_error = None
        try:
            from .service.progress import consumer_progress

            groups = consumer_progress(store, now_ms=generated)
        except CorruptedFileError as e:  # (the rest of the report still stands, as in `rmqstore info`)
            groups, groups_error = [], str(e)
        files, cl_rows = _files(store)
        root = _show(store.root_dir)
    du = shutil.disk_usage(store_dir)
    summary: dict = {
        "output": out,
        "format": fmt,
        "topics": {t: {"messages": int(v["messages"]), "bytes": int(v["bytes"])} for t, v in scan.topics.items()},
        "queues": scan.queues,
        "groups": groups,
        "files": files,
        "disk": {"total": du.total, "used": du.used, "free": du.free},
        "time_buckets": scan.buckets,
        "bucket_ms": scan.bucket_ms,
        "start_ms": scan.start_ms,
        "undated": scan.undated,
        "out_of_range": scan.out_of_range,
    }
    if groups_error is not None:
        summary["groups_error"] = groups_error
    if fmt == "html":
        data = _html(summary, scan, cl_rows, root, generated).encode("utf-8", "backslashreplace")
    else:
        data = _png(summary, scan, root, generated)
    _write_atomically(out, data)
    return summary
