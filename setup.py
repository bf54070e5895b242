"""Build the Cython core (rmqstore/_core.pyx); everything else is in pyproject.toml.

RMQSTORE_PURE_PYTHON=1 at build time skips the extension (pure-Python install).
"""

import os

from setuptools import Extension, setup


def _truthy(name):
    return os.environ.get(name, "").strip().lower() not in ("", "0", "false", "no")


ext_modules = []
if not _truthy("RMQSTORE_PURE_PYTHON"):
    from Cython.Build import cythonize

    ext_modules = cythonize(
        [
            Extension(
                "rmqstore._core",
                ["rmqstore/_core.pyx"],
                libraries=["z"],
                extra_compile_args=["-O3"],
            )
        ],
        compiler_directives={
            "language_level": "3",
            "boundscheck": False,
            "wraparound": False,
            "cdivision": True,
            "initializedcheck": False,
        },
    )

setup(ext_modules=ext_modules)
