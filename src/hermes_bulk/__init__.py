"""hermes-bulk: apply one instruction to many items as a durable job, and budget cron requests.

The public surface: `Jobs` (the service API), `load_settings`, and the error classes.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from .errors import HermesBulkError

if TYPE_CHECKING:
    from .config.settings import Settings, load_settings

__version__ = "0.1.0"

__all__ = ["Settings", "load_settings", "HermesBulkError", "__version__"]


def __getattr__(name: str) -> Any:
    # Settings loads pydantic-settings, which costs more than a read command may
    # (docs/benchmarks.md, row 7):
    # it is loaded when asked for, not with the package.
    if name in ("Settings", "load_settings"):
        from .config import settings as config

        return getattr(config, name)
    raise AttributeError(f"module 'hermes_bulk' has no attribute {name!r}")
