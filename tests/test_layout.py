"""The package layout: modules that moved into a package keep their old import
path working. Each old module is a short re-export of its new home; these
tests check that it exposes the same objects (so a re-export cannot go stale
when the new module changes), and that the packaging lists every package.
"""

from __future__ import annotations

import importlib
import inspect
import sys
from pathlib import Path

import pytest

#: old import path -> the module the code now lives in
MOVED = {
    "rmqstore._pure_message": "rmqstore._pure.message",
    "rmqstore._layout": "rmqstore.format.layout",
    "rmqstore._ids": "rmqstore.format.ids",
    "rmqstore.mapped_file": "rmqstore.storage.mapped_file",
    "rmqstore.checkpoint": "rmqstore.storage.checkpoint",
    "rmqstore.consumequeue": "rmqstore.storage.consumequeue",
    "rmqstore.index": "rmqstore.storage.index",
    "rmqstore.walker": "rmqstore.storage.walker",
    "rmqstore.offsets": "rmqstore.service.offsets",
    "rmqstore.consumer": "rmqstore.service.consumer",
    "rmqstore.aio": "rmqstore.service.aio",
    "rmqstore.retention": "rmqstore.service.retention",
}


def _public(module) -> set:
    """The names a module offers: its ``__all__``, or (no ``__all__``) every
    name not starting with ``_`` that is not an imported module."""
    if hasattr(module, "__all__"):
        return set(module.__all__)
    return {n for n, v in vars(module).items() if not n.startswith("_") and not inspect.ismodule(v)}


@pytest.mark.parametrize("old, new", sorted(MOVED.items()))
def test_an_old_path_exposes_the_new_modules_objects(old, new):
    old_mod, new_mod = importlib.import_module(old), importlib.import_module(new)
    assert old_mod is not new_mod
    assert new in (old_mod.__doc__ or ""), f"{old}'s docstring names where the code lives"
    # every public name of the new module, under the old path too
    missing = _public(new_mod) - set(vars(old_mod))
    assert not missing, f"{old} lacks {sorted(missing)}"
    if hasattr(new_mod, "__all__"):
        assert list(old_mod.__all__) == list(new_mod.__all__)
    # and everything the old module holds is the new module's object, not a copy
    for name, value in vars(old_mod).items():
        if name.startswith("__") and name.endswith("__"):
            continue
        assert getattr(new_mod, name) is value, f"{old}.{name} is not {new}.{name}"


def test_the_old_paths_hold_no_code():
    """A re-export defines nothing: no function or class has its home there."""
    for old in MOVED:
        mod = importlib.import_module(old)
        defined = [v for v in vars(mod).values() if inspect.isfunction(v) or inspect.isclass(v)]
        homes = {getattr(v, "__module__", None) for v in defined}
        assert old not in homes, old


def test_the_tools_package_keeps_its_names():
    """``from rmqstore.tools import X`` as before the package split, the
    names the tests and the command line use included."""
    import rmqstore.tools as tools
    from rmqstore.tools import inference, recover, salvage, verify

    assert set(tools.__all__) == {"Problem", "verify_store", "salvage_store", "recover_store", "infer_config"}
    assert tools.verify_store is verify.verify_store and tools.Problem is verify.Problem
    assert tools.salvage_store is salvage.salvage_store and tools.recover_store is recover.recover_store
    assert tools.infer_config is inference.infer_config
    assert (tools._Rec, tools._RecordTable, tools._Verifier) == (verify._Rec, verify._RecordTable, verify._Verifier)


def test_the_packaging_lists_every_package():
    """pyproject's ``packages`` (no package discovery) names every directory
    of rmqstore/ that holds an ``__init__.py``, so the wheel carries them all."""
    root = Path(__file__).resolve().parent.parent
    if not (root / "rmqstore" / "__init__.py").is_file() or not (root / "pyproject.toml").is_file():
        pytest.skip("no source tree beside tests/ (a wheel's copy of the tests)")
    if sys.version_info < (3, 11):
        pytest.skip("tomllib is Python 3.11+")
    import tomllib

    listed = set(tomllib.loads((root / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]["packages"])
    found = {
        ".".join(p.parent.relative_to(root).parts)
        for p in (root / "rmqstore").rglob("__init__.py")
        if "__pycache__" not in p.parts
    }
    assert listed == found


#: MessageStore's layers from the top, each a module of rmqstore/store/
STORE_LAYERS = ["facade", "pull", "put", "recovery", "commit", "space", "follow", "base"]


def test_the_store_is_built_in_layers():
    """MessageStore is a chain of classes, one per module of rmqstore/store/,
    each a subclass of the one below it, and a layer's methods call only
    methods of their own layer or of the layers below it: what a layer uses
    is visible from where it sits."""
    import ast

    from rmqstore.store import MessageStore

    chain = [c for c in MessageStore.__mro__ if c.__module__.startswith("rmqstore.store.")]
    assert [c.__module__.rsplit(".", 1)[1] for c in chain] == STORE_LAYERS
    defined = {c: {n for n, v in vars(c).items() if callable(v) or isinstance(v, (property, classmethod, staticmethod))}
               for c in chain}
    upward = []
    for depth, cls in enumerate(chain):
        above = set().union(*(defined[c] for c in chain[:depth])) - set().union(*(defined[c] for c in chain[depth:]))
        tree = ast.parse(inspect.getsource(inspect.getmodule(cls)))
        for node in ast.walk(tree):
            if isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name) \
                    and node.value.id in ("self", "cls", "store") and node.attr in above:
                upward.append(f"{cls.__name__} uses {node.attr} (line {node.lineno})")
    assert upward == []
    assert len(defined[chain[0]]) > 5 and all(defined[c] for c in chain)
