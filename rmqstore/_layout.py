"""Moved to :mod:`rmqstore.format.layout`; this module re-exports its constants for old imports."""

from .format.layout import *  # noqa: F403 (every name of the layout module is public)
