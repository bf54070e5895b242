"""Moved to :mod:`rmqstore.storage.checkpoint`; this module re-exports its names for old imports."""

from .storage.checkpoint import StoreCheckpoint, field_problems

__all__ = ["StoreCheckpoint", "field_problems"]
