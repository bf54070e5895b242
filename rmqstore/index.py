"""Moved to :mod:`rmqstore.storage.index`; this module re-exports its names for old imports."""

from .storage.index import (
    IndexFile,
    IndexService,
    build_index_file,
    header_problem,
    index_file_size,
    keys_of,
    new_file_names,
)
from .storage.index import _geometry_fits as _geometry_fits
from .storage.index import infer_index_geometry as infer_index_geometry

__all__ = [
    "IndexFile", "IndexService", "build_index_file", "header_problem", "index_file_size", "keys_of",
    "new_file_names",
]
