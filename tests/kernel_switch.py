"""Switch rmqstore's kernels between the Cython core and the pure-Python twin
at run time: a test and benchmark helper (``tests/conftest.py``'s ``impl``
fixture, ``bench/conftest.py``, ``bench/peers.py``), not part of the library,
which picks its implementation once, at import (``rmqstore/_kernels.py``:
``RMQSTORE_PURE_PYTHON``, ``RMQSTORE_REQUIRE_EXTENSION``)."""

from __future__ import annotations

import importlib

import rmqstore
from rmqstore import _kernels


def select(implementation: str) -> str:
    """Switch every kernel of ``rmqstore._kernels`` to ``"cython"`` or
    ``"python"`` and return the previous choice, so that one process can
    compare both. Stores opened before keep working: their put path (the
    ``Appender``, ``PutGate`` and ``AppendLock`` a store makes when it opens)
    and their lookups and pulls (its ``ReadGate``) stay the ones they were
    opened with; every other kernel switches (they are stateless).
    ``rmqstore.IMPLEMENTATION`` follows. Raises ValueError for another name,
    ImportError when the Cython core is not built."""
    if implementation == "cython":
        module = importlib.import_module("rmqstore._core")
    elif implementation == "python":
        module = importlib.import_module("rmqstore._pure")
    else:
        raise ValueError(f"implementation must be 'cython' or 'python', got {implementation!r}")
    previous = _kernels.IMPLEMENTATION
    for name in _kernels.KERNELS:
        setattr(_kernels, name, getattr(module, name))
    _kernels.IMPLEMENTATION = rmqstore.IMPLEMENTATION = implementation
    return previous
