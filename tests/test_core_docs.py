"""The compiled core documents itself: every public class, method and function
of ``rmqstore._core`` has a docstring whose first line is its signature
(``embedsignature``, setup.py), and ``inspect``/``help()`` show both.

Skipped when the core is not built, unless RMQSTORE_REQUIRE_EXTENSION=1.
"""

import inspect
import pydoc
import re

import pytest

from rmqstore._kernels import KERNELS
from test_kernels import _need_core

CLASSES = ("Appender", "AppendLock", "PutGate", "ReadGate", "Message", "MessageExt", "StoreState", "MappedRegion",
           "MappedQueue", "CommitLogBase", "ConsumeQueueBase", "IndexRegion", "IndexServiceBase", "ReferenceResource",
           "StoreCore")
DATA_CLASSES = ("StoreState", "MappedRegion", "MappedQueue", "CommitLogBase", "ConsumeQueueBase", "IndexRegion",
                "IndexServiceBase")  # (fields only, no methods)
FUNCTIONS = tuple(name for name in KERNELS if name not in CLASSES)


def _body(doc):
    """The docstring after its embedded signature line."""
    return doc.split("\n", 1)[1].strip() if "\n" in doc else ""


@pytest.mark.parametrize("name", FUNCTIONS)
def test_function_has_signature_and_docstring(name):
    fn = getattr(_need_core(), name)
    doc = fn.__doc__ or ""
    assert doc.startswith(f"{name}("), doc[:80]
    assert _body(doc), f"{name} has only its signature"
    params = inspect.signature(fn).parameters
    assert list(params) == _split_params(doc.split("\n", 1)[0]), doc.split("\n", 1)[0]


def _split_params(line):
    """The parameter names of an embedded signature line such as
    ``f(a, bool b, c=1) -> int`` or ``f(a, b: bool, c=1)``."""
    inner = line[line.index("(") + 1: line.rindex(")")]
    parts, depth, cur = [], 0, ""
    for ch in inner:
        if ch == "," and depth == 0:
            parts.append(cur.strip())
            cur = ""
            continue
        depth += ch in "([{"
        depth -= ch in ")]}"
        cur += ch
    if cur.strip():
        parts.append(cur.strip())
    # "bool flag" (C style) or "flag: bool" (Python style), maybe "=default"
    return [p.split("=")[0].split(":")[0].split()[-1].strip("*") for p in parts if p not in ("*", "/")]


@pytest.mark.parametrize("name", CLASSES)
def test_class_and_its_public_methods_have_docstrings(name):
    cls = getattr(_need_core(), name)
    assert (cls.__doc__ or "").strip(), f"{name} has no docstring"
    methods = [m for m, v in vars(cls).items() if not m.startswith("_") and callable(v)]
    assert bool(methods) is (name not in DATA_CLASSES), name
    for meth in methods:
        doc = getattr(cls, meth).__doc__ or ""
        assert re.match(rf"({name}\.)?{meth}\(self\b", doc), (meth, doc[:80])
        assert _body(doc), f"{name}.{meth} has only its signature"
        assert next(iter(inspect.signature(getattr(cls, meth)).parameters)) == "self"
    shown = pydoc.render_doc(cls, renderer=pydoc.plaintext)
    assert cls.__doc__.strip().split("\n", 1)[0] in shown
    for meth in methods:
        assert f"{meth}(self" in shown, meth


def test_core_and_twin_have_the_same_public_names():
    core = _need_core()
    from rmqstore import _pure

    for name in KERNELS:
        assert hasattr(core, name) and hasattr(_pure, name), name


def test_the_store_methods_read_the_same_in_both_implementations():
    """``MessageStore``'s put and read methods are StoreCore's: the core's
    docstrings (after the embedded signature) are the twin's, word for word,
    so ``help(MessageStore)`` reads the same whichever is built."""
    core = _need_core()
    from rmqstore import _pure

    for name in ("put_message", "get_offset_in_queue_by_time", "query_messages", "get_messages",
                 "get_message_views"):
        twin = inspect.getdoc(getattr(_pure.StoreCore, name))
        assert twin and len(twin) > 200, name
        assert inspect.cleandoc(_body(getattr(core.StoreCore, name).__doc__)) == twin, name
