"""Moved to :mod:`rmqstore.service.retention`; this module re-exports its names for old imports."""

from .service.retention import CleanupReport, Retention, disk_usage_ratio

__all__ = ["CleanupReport", "Retention", "disk_usage_ratio"]
