"""Moved to :mod:`rmqstore.service.aio`; this module re-exports its names for old imports."""

from .service.aio import AsyncMessageStore

__all__ = ["AsyncMessageStore"]
