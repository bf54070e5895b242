"""Moved to :mod:`rmqstore.storage.mapped_file`; this module re-exports its names for old imports."""

from .storage.mapped_file import _NOFOLLOW as _NOFOLLOW
from .storage.mapped_file import MappedFile, MappedFileQueue, ReferenceResource, fsync_dir, offset_to_file_name
from .storage.mapped_file import allocate_file as allocate_file
from .storage.mapped_file import open_no_follow as open_no_follow

__all__ = ["MappedFile", "MappedFileQueue", "ReferenceResource", "offset_to_file_name", "fsync_dir"]
