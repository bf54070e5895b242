"""Moved to :mod:`rmqstore.storage.index`; this module re-exports its names for old imports."""

from .storage.index import IndexFile, IndexService, header_problem, index_file_size, keys_of
from .storage.index import _geometry_fits as _geometry_fits
from .storage.index import infer_index_geometry as infer_index_geometry

__all__ = ["IndexFile", "IndexService", "header_problem", "index_file_size", "keys_of"]
