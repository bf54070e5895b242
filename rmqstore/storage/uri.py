"""Store directories named by a URI: ``s3://``, ``gs://``, ``abfs://``,
``hdfs://`` and whatever else ``pyarrow.fs.FileSystem.from_uri`` knows.

Stores copied off brokers live on object storage; Spark's executors on
separate hosts share nothing else. These helpers read such a store's files
by byte ranges (a CommitLog file is never fetched whole to plan a read) and
copy files up and down for the writers. The file system, its endpoint and
its credentials come from the URI and the standard environment, as pyarrow
takes them: ``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
``AWS_SECRET_ACCESS_KEY``, ``AWS_DEFAULT_REGION`` for S3, or the URI's
query (``s3://bucket/store?endpoint_override=host:9000&scheme=http``),
which every file URI made from it keeps.

Needs ``pyarrow`` (the ``rmqstore[spark]`` extra); local paths and
``file:`` URIs never come here.
"""

from __future__ import annotations

import functools
import os
import posixpath
from typing import Any
from urllib.parse import urlsplit

__all__ = ["is_uri", "shown", "join", "basename", "names", "parent", "list_dir", "list_files", "move_dir", "file_size",
           "is_dir", "read_range", "read_all", "open_input", "open_output", "delete_dir", "delete_file", "download",
           "upload", "put_file"]


def is_uri(path) -> bool:
    """Whether *path* names a store through a file system URI (``scheme://``)
    rather than a local path (``file:`` URIs are local paths)."""
    text = os.fspath(path) if not isinstance(path, str) else path
    if not isinstance(text, str) or "://" not in text:
        return False
    scheme = text.split("://", 1)[0]
    return scheme.isascii() and scheme.replace("+", "").replace("-", "").replace(".", "").isalnum() \
        and scheme.lower() != "file"


def shown(path: str) -> str:
    """*path* as messages and logs show it: a URI without the credentials
    its authority may carry (``s3://key:secret@bucket/...``)."""
    if not is_uri(path):
        return path
    u = urlsplit(path)
    if "@" not in u.netloc:
        return path
    return u._replace(netloc="***@" + u.netloc.rpartition("@")[2]).geturl()


def _parts(uri: str) -> tuple:
    """``(scheme://authority, path, ?query)`` of *uri*."""
    u = urlsplit(uri)
    return f"{u.scheme}://{u.netloc}", u.path, f"?{u.query}" if u.query else ""


def join(uri: str, *names: str) -> str:
    """*uri* with *names* appended to its path (the query stays at the end)."""
    root, path, query = _parts(uri)
    return root + posixpath.join(path or "/", *names) + query


def basename(uri: str) -> str:
    """The last name of *uri*'s path."""
    return posixpath.basename(_parts(uri)[1].rstrip("/"))


def names(uri: str) -> list:
    """The names along *uri*: its authority without credentials (an S3
    bucket, a name node), then each name of its path."""
    u = urlsplit(uri)
    return [n for n in [u.netloc.rpartition("@")[2], *u.path.split("/")] if n]


def parent(uri: str) -> str:
    """*uri* without the last name of its path."""
    root, path, query = _parts(uri)
    return root + (posixpath.dirname(path.rstrip("/")) or "/") + query


@functools.lru_cache(maxsize=32)
def _filesystem(root_and_query: str) -> tuple:
    """``(FileSystem, path of the root)`` for ``scheme://authority?query``;
    one client per bucket or name node and process (making one costs
    milliseconds and, for S3, a region lookup)."""
    from pyarrow import fs

    return fs.FileSystem.from_uri(root_and_query)


def _resolve(uri: str) -> tuple:
    """``(FileSystem, its path for uri)``."""
    root, path, query = _parts(uri)
    filesystem, base = _filesystem(root + query)
    return filesystem, base.rstrip("/") + (path if path.startswith("/") else "/" + path)


def list_dir(uri: str) -> list:
    """``[(name, is_directory, size in bytes)]`` of the entries directly in
    directory *uri*, sorted by name; ``[]`` when there is none."""
    from pyarrow import fs

    filesystem, path = _resolve(uri)
    try:
        infos = filesystem.get_file_info(fs.FileSelector(path, allow_not_found=True))
    except (FileNotFoundError, NotADirectoryError):
        return []
    return sorted((i.base_name, i.type == fs.FileType.Directory, i.size or 0) for i in infos)


def list_files(uri: str) -> list:
    """``[(relative path, size in bytes)]`` of every file under directory
    *uri*, at any depth (``/``-separated paths), sorted; ``[]`` when there
    is none."""
    from pyarrow import fs

    filesystem, path = _resolve(uri)
    infos = filesystem.get_file_info(fs.FileSelector(path, recursive=True, allow_not_found=True))
    return sorted((posixpath.relpath(i.path, path), int(i.size or 0)) for i in infos if i.type == fs.FileType.File)


def move_dir(src: str, dst: str) -> None:
    """Move every file under directory *src* to the same relative path under
    *dst* (on object storage a copy and a delete per object: not atomic),
    then delete *src*. Both on one file system."""
    filesystem, src_path = _resolve(src)
    _fs2, dst_path = _resolve(dst)
    for rel, _size in list_files(src):
        target = posixpath.join(dst_path, rel)
        filesystem.create_dir(posixpath.dirname(target), recursive=True)
        filesystem.move(posixpath.join(src_path, rel), target)
    delete_dir(src)


def is_dir(uri: str) -> bool:
    """Whether *uri* is a directory (on object storage: a prefix holding objects)."""
    from pyarrow import fs

    filesystem, path = _resolve(uri)
    return filesystem.get_file_info(path).type == fs.FileType.Directory


def file_size(uri: str) -> int:
    """Bytes in file *uri*; FileNotFoundError when there is none."""
    from pyarrow import fs

    filesystem, path = _resolve(uri)
    info = filesystem.get_file_info(path)
    if info.type != fs.FileType.File:
        raise FileNotFoundError(f"no file at {uri}")
    return int(info.size)


def read_range(uri: str, start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of file *uri* (fewer at its end)."""
    with open_input(uri) as f:
        return f.read_at(max(0, end - start), start)


def read_all(uri: str) -> bytes:
    """The whole of file *uri*."""
    with open_input(uri) as f:
        return f.read()


def open_input(uri: str) -> Any:
    """File *uri* opened for random-access reads (``pyarrow.NativeFile``)."""
    filesystem, path = _resolve(uri)
    return filesystem.open_input_file(path)


def open_output(uri: str) -> Any:
    """File *uri* opened for writing from its start (``pyarrow.NativeFile``);
    its directory is made as needed."""
    filesystem, path = _resolve(uri)
    filesystem.create_dir(posixpath.dirname(path), recursive=True)
    return filesystem.open_output_stream(path)


def delete_dir(uri: str) -> None:
    """Delete directory *uri* and everything in it; nothing when it is absent."""
    filesystem, path = _resolve(uri)
    try:
        filesystem.delete_dir(path)
    except FileNotFoundError:
        pass


def delete_file(uri: str) -> None:
    """Delete file *uri*; nothing when it is absent."""
    filesystem, path = _resolve(uri)
    try:
        filesystem.delete_file(path)
    except FileNotFoundError:
        pass


def download(uri: str, local_dir: str) -> int:
    """Copy every file under directory *uri* into *local_dir* (made as
    needed), keeping relative paths; returns the number of files."""
    filesystem, path = _resolve(uri)
    files = list_files(uri)
    for rel, _size in files:
        dest = os.path.join(local_dir, *rel.split("/"))
        os.makedirs(os.path.dirname(dest), exist_ok=True)
        with filesystem.open_input_stream(posixpath.join(path, rel)) as src, open(dest, "wb") as out:
            while chunk := src.read(8 << 20):
                out.write(chunk)
    return len(files)


def upload(local_dir: str, uri: str) -> int:
    """Copy every regular file under *local_dir* to directory *uri*, keeping
    relative paths and replacing files of the same name; returns the number
    of files."""
    n = 0
    for top, _dirs, files in os.walk(local_dir):
        for name in sorted(files):
            src = os.path.join(top, name)
            if os.path.islink(src) or not os.path.isfile(src):
                continue
            put_file(src, join(uri, *os.path.relpath(src, local_dir).split(os.sep)))
            n += 1
    return n


def put_file(path: str, uri: str) -> None:
    """Copy the local file *path* to file *uri* (replacing it)."""
    with open(path, "rb") as fh, open_output(uri) as out:
        while chunk := fh.read(8 << 20):
            out.write(chunk)
