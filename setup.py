"""Build the Cython core (rmqstore/_core.pyx); everything else is in pyproject.toml.

Build switches are environment variables only (no command-line flags):

RMQSTORE_PURE_PYTHON=1
    Skip the extension (pure-Python install).
RMQSTORE_DEBUG=1
    A development build of the core: bounds and wraparound checks on, Cython
    line tracing and profiling hooks (CYTHON_TRACE, CYTHON_TRACE_NOGIL: for
    coverage and profilers), C asserts on, ``-O0 -g``, and the annotated view
    ``rmqstore/_core.html`` written next to the .pyx (and one per unit in
    rmqstore/_core_units/). Same semantics as the release build
    (``cdivision`` stays on: the kernels rely on C division).
    ``RMQSTORE_DEBUG=1 pip install -e .`` for working on the core.

Switching between release and debug regenerates ``rmqstore/_core.c`` even
when it is newer than the .pyx (Cython only compares timestamps otherwise).
"""

import json
import os

from setuptools import Extension, setup

PYX = "rmqstore/_core.pyx"
GENERATED_C = "rmqstore/_core.c"

RELEASE_DIRECTIVES = {
    "language_level": "3",
    # help() shows each def's signature (the docstring's first line, Python
    # style); inspect.signature reads it from the (binding) cyfunctions
    "binding": True,
    "embedsignature": True,
    "embedsignature.format": "python",
    "boundscheck": False,
    "wraparound": False,
    "cdivision": True,
    "initializedcheck": False,
}
DEBUG_DIRECTIVES = dict(
    RELEASE_DIRECTIVES,
    boundscheck=True,
    wraparound=True,
    initializedcheck=True,
    linetrace=True,
    profile=True,
)
DEBUG_MACROS = [("CYTHON_TRACE", "1"), ("CYTHON_TRACE_NOGIL", "1")]


def _truthy(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


def _generated_in_debug(path):
    """Whether the generated C at *path* came from a debug build (True), a
    release build (False), or is missing or unreadable (None): Cython records
    the Extension's settings, debug macros included, in a metadata header."""
    try:
        with open(path, encoding="utf-8", errors="replace") as fh:
            head = fh.read(16384)
        meta = head.split("BEGIN: Cython Metadata", 1)[1].split("END: Cython Metadata", 1)[0]
        macros = json.loads(meta).get("distutils", {}).get("define_macros", [])
    except (OSError, IndexError, ValueError, AttributeError):
        return None
    return any(m and m[0] == "CYTHON_TRACE" for m in macros)


def _extensions():
    if _truthy("RMQSTORE_PURE_PYTHON"):
        return []
    from Cython.Build import cythonize

    debug = _truthy("RMQSTORE_DEBUG")
    if debug:
        ext = Extension(
            "rmqstore._core",
            [PYX],
            libraries=["z"],
            define_macros=DEBUG_MACROS,
            undef_macros=["NDEBUG"],
            extra_compile_args=["-O0", "-g"],
        )
    else:
        ext = Extension("rmqstore._core", [PYX], libraries=["z"], extra_compile_args=["-O3"])
    previous = _generated_in_debug(GENERATED_C)
    return cythonize(
        [ext],
        compiler_directives=DEBUG_DIRECTIVES if debug else RELEASE_DIRECTIVES,
        annotate=debug,
        force=previous is not None and previous != debug,
    )


setup(ext_modules=_extensions())
