"""Configuration inference for the tools: :func:`infer_config` reads a
store's CommitLog, ConsumeQueue and index files and returns a ``StoreConfig``
whose file sizes and index geometry match them, so stores written with
non-default sizes can be verified, salvaged and recovered;
``_header_geometry`` is its fallback when the index files are damaged."""

from __future__ import annotations

import os

from ..config import StoreConfig
from ..exceptions import RmqStoreError
from ..format.layout import (
    CQ_STORE_UNIT_SIZE,
    INDEX_ENTRY_SIZE,
    INDEX_HASH_SLOT_SIZE,
    INDEX_HEADER_SIZE,
)
from ..storage.index import index_file_size, infer_index_geometry
from ..storage.walker import list_segments
from ._common import _INDEX_HEADER, _common_size, _queue_dirs


def infer_config(root, base: StoreConfig | None = None):
    """A :class:`StoreConfig` whose file sizes match the store in *root*:
    CommitLog segment size, ConsumeQueue file size (the most common sizes) and
    the index geometry (``infer_index_geometry``). Everything else comes from
    *base* (default: ``StoreConfig()``). Returns ``(config, notes)``, notes
    being a list of texts about values that could not be inferred."""
    root = os.fspath(root)
    cfg = base if base is not None else StoreConfig()
    notes: list = []
    changes: dict = {}
    segs, _ = list_segments(os.path.join(root, "commitlog"))
    sizes = [os.path.getsize(p) for _, _, p in segs]
    sizes = [s for s in sizes if s > 0]
    if sizes:
        fs = _common_size(sizes)
        if fs >= 4096:
            changes["mapped_file_size_commit_log"] = fs
        else:
            notes.append(f"CommitLog segments of {fs} bytes are below StoreConfig's minimum; "
                         f"using {cfg.mapped_file_size_commit_log}")
    cq_sizes = []
    for _topic, _qid, qdir in _queue_dirs(root):
        for _, _, p in list_segments(qdir)[0]:
            n = os.path.getsize(p)
            if n > 0:
                cq_sizes.append(n)
    if cq_sizes:
        cs = _common_size(cq_sizes)
        if cs % CQ_STORE_UNIT_SIZE == 0:
            changes["mapped_file_size_consume_queue"] = cs
        else:
            notes.append(f"ConsumeQueue files of {cs} bytes are not whole units; "
                         f"using {cfg.mapped_file_size_consume_queue}")
    idx, _ = list_segments(os.path.join(root, "index"))
    if idx:
        paths = [p for _, _, p in idx]
        try:
            s, n = infer_index_geometry(paths, cfg.max_hash_slot_num, cfg.max_index_num)
            changes["max_hash_slot_num"], changes["max_index_num"] = s, n
        except (RmqStoreError, ValueError, OSError) as e:
            sizes = [os.path.getsize(p) for p in paths]
            geo = _header_geometry(paths, _common_size(sizes))
            if geo is not None:
                changes["max_hash_slot_num"], changes["max_index_num"] = geo
                notes.append(f"index geometry taken from the index headers ({e})")
            else:
                notes.append(f"index geometry not inferred ({e}); "
                             f"using {cfg.max_hash_slot_num} slots x {cfg.max_index_num} entries")
    if changes:
        cfg = cfg.replace(**changes)
    return cfg, notes


def _header_geometry(paths, size: int):
    """Fallback geometry when ``infer_index_geometry`` rejects damaged files:
    the geometry implied by the largest ``indexCount`` of any file (a full
    file's count is ``index_num``) whose arithmetic fits the file size, or
    a broker's or ``StoreConfig()``'s geometry if it fits. None when nothing fits."""
    counts = []
    for p in paths:
        with open(p, "rb") as fh:
            head = fh.read(INDEX_HEADER_SIZE)
        if len(head) == INDEX_HEADER_SIZE:
            counts.append(_INDEX_HEADER.unpack(head)[5])
    for default in (StoreConfig.broker_defaults(), StoreConfig()):
        if index_file_size(default.max_hash_slot_num, default.max_index_num) == size:
            return default.max_hash_slot_num, default.max_index_num
    for n in sorted(set(counts), reverse=True):
        rest = size - INDEX_HEADER_SIZE - INDEX_ENTRY_SIZE * n
        if n > 1 and rest > 0 and rest % INDEX_HASH_SLOT_SIZE == 0:
            return rest // INDEX_HASH_SLOT_SIZE, n
    return None
