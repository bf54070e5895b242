"""Developer tasks: ``nox -l`` lists them, ``nox`` runs the default ones (lint,
typing, the suite on the Cython core and on the pure-Python twin), ``nox -s
NAME`` one of them. Each runs in its own virtual environment under ``.nox/``
with the Python that runs nox (``nox --force-python 3.12 -s tests-core`` for
another); ``-r`` reuses the environments. Arguments after ``--`` go to pytest,
e.g. ``nox -s tests-core -- tests/test_kernels.py -x``.

The sessions that test install rmqstore editable (``pip install -e``), as CI
does: the core is compiled in place, one ``rmqstore/_core.*.so`` per Python.
``debug-build`` leaves a debug build of the core there (``RMQSTORE_DEBUG=1``,
see setup.py); any other session that installs puts the release build back.
"""

from __future__ import annotations

import nox

nox.options.sessions = ["lint", "typing", "tests-core", "tests-pure"]

RUFF = "ruff==0.17.6"  # as in .pre-commit-config.yaml
CYTHON_LINT = "cython-lint==0.22.1"
MYPY = "mypy==2.4.1"  # as in .github/workflows/tests.yml and .ci/wheel-check

# the benchmark suite at the small sizes .ci/run uses: a smoke run, numbers not judged
BENCH_SMOKE = {
    "RMQSTORE_BENCH_N": "2000",
    "RMQSTORE_BENCH_PEERS_N": "2000",
    "RMQSTORE_BENCH_SYNC_N": "400",
    "RMQSTORE_BENCH_RECOVERY_MB": "16",
    "RMQSTORE_BENCH_SCAN_MB": "8",
    "RMQSTORE_BENCH_SPARK_N": "20000",
    "RMQSTORE_BENCH_SPARK_ROUNDS": "1",
}


def _install(session: nox.Session, extras: str = "test", **env: str) -> None:
    """rmqstore, editable, with *extras*; *env* for the build (RMQSTORE_DEBUG,
    RMQSTORE_PURE_PYTHON)."""
    session.install("-e", f".[{extras}]" if extras else ".", env=env)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff on the Python code and cython-lint on the core (pyproject.toml holds both configurations)."""
    session.install(RUFF, CYTHON_LINT)
    session.run("ruff", "check", ".")
    session.run("cython-lint", "rmqstore/_core.pyx", "rmqstore/_core_units")


@nox.session
def build(session: nox.Session) -> None:
    """Release build: the sdist, then a wheel built from it (the core at -O3), into dist/."""
    session.install("build==1.6.1")
    session.run("python", "-m", "build", "--outdir", "dist")


@nox.session(name="debug-build")
def debug_build(session: nox.Session) -> None:
    """RMQSTORE_DEBUG=1 build of the core (bounds checks, line tracing, C asserts,
    rmqstore/_core.html), then the suite on it."""
    _install(session, RMQSTORE_DEBUG="1")
    session.run("python", "-c", "import os; assert os.path.exists('rmqstore/_core.html')")
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *session.posargs,
                env={"RMQSTORE_REQUIRE_EXTENSION": "1"})


@nox.session(name="tests-core")
def tests_core(session: nox.Session) -> None:
    """The suite on the Cython core: a missing core fails instead of falling back."""
    _install(session)
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *session.posargs,
                env={"RMQSTORE_REQUIRE_EXTENSION": "1"})


@nox.session(name="tests-pure")
def tests_pure(session: nox.Session) -> None:
    """The suite on the pure-Python twin."""
    _install(session)
    session.run("python", "-m", "pytest", "-p", "no:cacheprovider", *session.posargs,
                env={"RMQSTORE_PURE_PYTHON": "1"})


@nox.session
def typing(session: nox.Session) -> None:
    """mypy on the package, and stubtest: rmqstore/_core.pyi against the built core."""
    _install(session, extras="")
    session.install(MYPY)
    session.run("python", "-m", "mypy")
    session.run("python", "-m", "mypy.stubtest", "--mypy-config-file", "pyproject.toml", "rmqstore._core")


@nox.session(name="bench-smoke")
def bench_smoke(session: nox.Session) -> None:
    """The benchmarks at small sizes (both implementations, the peers where
    installed); they check answers, not times."""
    _install(session, extras="test,bench")
    session.run("python", "-m", "pytest", "bench", "-q", "-p", "no:cacheprovider", *session.posargs, env=BENCH_SMOKE)
