"""Tools for damaged stores: ``verify``, ``salvage`` and ``recover``.

* :func:`verify_store` (``verify``) reads every file of a store (read-only
  mappings; it never opens anything writable and never calls
  ``MessageStore.open``) and returns the list of :class:`Problem` found, each
  with the file (relative to the store root) and the byte offset in that file.
* :func:`salvage_store` (``salvage``) copies every message that still
  validates (body CRC, ``__CRC32#`` when present, stored physical offset) into
  a new store, resynchronising after damaged regions; the source is only read.
* :func:`recover_store` (``recover``) opens the store writable (which runs
  recovery, docs/recovery.md#recovery) and closes it again, returning
  ``MessageStore.recovery_report``.

File sizes and the index geometry of the store are inferred from its files
(:func:`infer_config`, ``inference``), so stores written with non-default
sizes work. Helpers the tools share are in ``_common``.
"""

from __future__ import annotations

from .inference import infer_config
from .recover import recover_store
from .salvage import salvage_store
from .verify import Problem, verify_store

# the record table and the verifier, for the tests that check them directly
from .verify import _Rec as _Rec
from .verify import _RecordTable as _RecordTable
from .verify import _Verifier as _Verifier

__all__ = [
    "Problem",
    "verify_store",
    "salvage_store",
    "recover_store",
    "infer_config",
]
