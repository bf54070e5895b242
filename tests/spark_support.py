"""Whether Spark can run here: a test and benchmark helper (the Spark test
modules in ``tests/`` and ``bench/``), not part of the library."""

from __future__ import annotations

import os
import shutil

import pytest


def require_spark() -> None:
    """Skip the calling test module (at import) when pyspark[sql] or Java is
    missing; under ``RMQSTORE_REQUIRE_SPARK=1`` (CI) that is an error."""
    why = None
    try:
        import pandas  # noqa: F401
        import pyarrow  # noqa: F401
        import pyspark  # noqa: F401
    except ImportError as e:
        why = f"pyspark[sql] is not installed ({e}); pip install -e '.[spark,test]'"
    if why is None and not (shutil.which("java") or os.environ.get("JAVA_HOME")):
        why = "no Java runtime (java is not on PATH and JAVA_HOME is unset)"
    if why is not None:
        if os.environ.get("RMQSTORE_REQUIRE_SPARK") == "1":
            raise RuntimeError(f"RMQSTORE_REQUIRE_SPARK=1 but {why}")
        pytest.skip(why, allow_module_level=True)
