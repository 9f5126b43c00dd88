"""hermes-bulk: apply one instruction to many items as a durable job, and budget cron requests.

The public surface: `Jobs` (the service API), `load_settings`, and the error classes.
"""

from .config import Settings, load_settings
from .errors import HermesBulkError

__version__ = "0.1.0"

__all__ = ["Settings", "load_settings", "HermesBulkError", "__version__"]
