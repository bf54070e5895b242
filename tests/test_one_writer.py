"""One writer, always.

A store used in a child after ``fork()`` refuses every call there with a
clear error and writes nothing (the parent's handle is unaffected; the child
may open the store itself once the parent has closed it). Two writable
handles on one directory in one process are refused however the directory
is reached (a symbolic link, a rename, a bind mount): a store is known by
its device and inode, not by its path.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading

import pytest

from conftest import no_hang
from rmqstore import Message, MessageStore, StoreClosedError, StoreConfig, StoreLockedError

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork()")

CFG = StoreConfig(mapped_file_size_commit_log=64 * 1024, mapped_file_size_consume_queue=2000,
                  max_hash_slot_num=16, max_index_num=64, clean_service_enable=False,
                  make_files_ahead=False)  # (files are compared byte for byte while the store is open)


def in_child(fn) -> dict:
    """Run *fn()* in a forked child; its JSON-able result (or the error it
    raised, by class name) comes back through a pipe. The child leaves with
    os._exit, so nothing of the parent's runs there at exit."""
    r, w = os.pipe()
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        os.close(r)
        try:
            out = {"result": fn()}
        except BaseException as e:  # noqa: BLE001 (everything goes back to the parent)
            out = {"error": type(e).__name__, "message": str(e)}
        os.write(w, json.dumps(out).encode())
        os._exit(0)
    os.close(w)
    data = b""
    with no_hang(30):
        while chunk := os.read(r, 65536):
            data += chunk
        _, status = os.waitpid(pid, 0)
    os.close(r)
    assert os.WIFEXITED(status) and os.WEXITSTATUS(status) == 0, status
    return json.loads(data)


def files_of(root) -> dict:
    """Every file under *root*: its bytes (what the child must not change)."""
    out = {}
    for d, _dirs, names in os.walk(root):
        for n in names:
            p = os.path.join(d, n)
            with open(p, "rb") as fh:
                out[os.path.relpath(p, root)] = fh.read()
    return out


CALLS = {
    "put_message": lambda s: s.put_message(Message("T", b"child")),
    "put_messages": lambda s: s.put_messages([Message("T", b"child")]),
    "put_message_columns": lambda s: s.put_message_columns("T", [b"child"]),
    "get_messages": lambda s: s.get_messages("T", 0, 0),
    "get_message": lambda s: s.get_message(0),
    "query_messages": lambda s: s.query_messages("T", "k"),
    "get_offset_in_queue_by_time": lambda s: s.get_offset_in_queue_by_time("T", 0, 0),
    "get_message_views": lambda s: s.get_message_views("T", 0, 0),
    "get_message_columns": lambda s: s.get_message_columns("T", 0, 0),
    "flush": lambda s: s.flush(),
    "commit_offset": lambda s: s.commit_offset("g", "T", 0, 1),
    "delete_expired": lambda s: s.delete_expired(),
    "iter_messages": lambda s: next(s.iter_messages()),
}


@pytest.mark.parametrize("call", sorted(CALLS))
def test_a_forked_child_cannot_use_the_parents_store(tmp_path, call):
    root = tmp_path / "s"
    with MessageStore.open(root, CFG) as s:
        s.put_message(Message("T", b"parent", keys="k"))
        s.flush()
        before = files_of(root)

        def child():
            try:
                CALLS[call](s)
            except StoreClosedError as e:
                s.close()  # a no-op there: the child writes nothing
                return ["refused", str(e)]
            return ["answered", None]

        out = in_child(child)
        assert out["result"][0] == "refused"
        assert "forked" in out["result"][1] and str(os.getpid()) in out["result"][1]
        assert files_of(root) == before  # not a byte: no abort removed, no checkpoint, no flush
        r = s.put_message(Message("T", b"after"))  # the parent's handle is unaffected
        assert s.get_message(r.wrote_offset).body == b"after"
    # the child may open the store itself once the parent has closed it
    out = in_child(lambda: [m.body.decode() for m in MessageStore.open(root, CFG).iter_messages()])
    assert out["result"] == ["parent", "after"]


def test_a_child_forked_while_a_put_holds_the_lock_does_not_hang(tmp_path):
    """A parent thread keeps putting (holding the append lock now and then)
    while the main thread forks: in each child the store refuses at once
    instead of waiting for a lock no thread there will release."""
    root = tmp_path / "s"
    stop = threading.Event()
    with MessageStore.open(root, CFG) as s:
        def producer():
            while not stop.is_set():
                s.put_messages([Message("T", b"x" * 100, queue_id=i % 4) for i in range(50)])

        t = threading.Thread(target=producer)
        t.start()
        try:
            for _ in range(20):
                out = in_child(lambda: CALLS["put_messages"](s))
                assert out["error"] == "StoreClosedError"
        finally:
            stop.set()
            t.join()


def test_the_child_may_open_the_store_while_the_parent_has_none(tmp_path):
    root = tmp_path / "s"
    with MessageStore.open(root, CFG) as s:
        s.put_message(Message("T", b"a"))
    other = MessageStore.open(tmp_path / "other", CFG)  # open elsewhere: the child's registry is clear of it too
    try:
        def child():
            with MessageStore.open(root, CFG) as c:
                c.put_message(Message("T", b"b"))
            with MessageStore.open(tmp_path / "other", CFG) as o:  # the parent holds its lock: refused
                return ["opened", o.root_dir]

        out = in_child(child)
        assert out["error"] == "StoreLockedError"
    finally:
        other.close()
    with MessageStore.open(root, read_only=True) as ro:
        assert [m.body for m in ro.iter_messages()] == [b"a", b"b"]


# --- one directory, many paths ------------------------------------------------------


def test_a_symbolic_link_to_an_open_store_is_the_same_store(tmp_path):
    root = tmp_path / "s"
    with MessageStore.open(root, CFG):
        os.symlink(root, tmp_path / "link")
        with pytest.raises(StoreLockedError):
            MessageStore.open(tmp_path / "link", CFG)
    with MessageStore.open(tmp_path / "link", CFG) as s:  # closed: either path opens it
        s.put_message(Message("T", b"x"))


def test_a_renamed_store_is_the_same_store(tmp_path):
    with MessageStore.open(tmp_path / "s", CFG) as s:
        s.put_message(Message("T", b"x"))
        os.rename(tmp_path / "s", tmp_path / "moved")
        try:
            with pytest.raises(StoreLockedError):
                MessageStore.open(tmp_path / "moved", CFG)
        finally:
            os.rename(tmp_path / "moved", tmp_path / "s")  # (the open handle works by its path)
    with MessageStore.open(tmp_path / "s", read_only=True) as ro:
        assert [m.body for m in ro.iter_messages()] == [b"x"]


def test_a_bind_mount_of_an_open_store_is_the_same_store(tmp_path):
    if not hasattr(os, "geteuid") or os.geteuid() != 0:
        pytest.skip("a bind mount needs root")
    root, mnt = tmp_path / "s", tmp_path / "mnt"
    root.mkdir()
    mnt.mkdir()
    p = subprocess.run(["mount", "--bind", str(root), str(mnt)], capture_output=True, text=True)
    if p.returncode != 0:
        pytest.skip(f"mount --bind is not permitted here: {p.stderr.strip()}")
    try:
        with MessageStore.open(root, CFG) as s:
            s.put_message(Message("T", b"x"))
            with pytest.raises(StoreLockedError):
                MessageStore.open(mnt, CFG)
        with MessageStore.open(mnt, CFG) as s:
            assert [m.body for m in s.iter_messages()] == [b"x"]
    finally:
        subprocess.run(["umount", "-l", str(mnt)], capture_output=True)
