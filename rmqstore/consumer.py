"""Moved to :mod:`rmqstore.service.consumer`; this module re-exports its names for old imports."""

from .service.consumer import Consumer

__all__ = ["Consumer"]
