"""Moved to :mod:`rmqstore.service.aio`; this module re-exports its names for old imports."""

from .service.aio import AsyncConsumer, AsyncMessageStore

__all__ = ["AsyncConsumer", "AsyncMessageStore"]
