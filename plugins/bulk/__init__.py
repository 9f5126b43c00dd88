"""Bulk as a directory plugin: <hermes home>/plugins/bulk/ → the hermes_bulk package's plugin.

The code lives in the hermes-bulk package (and its dependencies: huey, pydantic-settings, …),
so it has to be importable in Hermes' own Python. When this folder is a link into a checkout of
hermes-bulk, the checkout's src/ is used. When the package cannot be imported, /bulk still
registers and says how to install it, instead of the command silently missing.
"""

from __future__ import annotations

import sys
from pathlib import Path

_CHECKOUT_SRC = Path(__file__).resolve().parents[2] / "src"


def _import_plugin():
    if (_CHECKOUT_SRC / "hermes_bulk" / "__init__.py").is_file() and str(_CHECKOUT_SRC) not in sys.path:
        sys.path.append(str(_CHECKOUT_SRC))  # after site-packages: an installed hermes-bulk wins
    from hermes_bulk.plugin import bulk

    return bulk


def register(ctx) -> None:
    try:
        bulk = _import_plugin()
    except ImportError as exc:
        missing = (getattr(exc, "name", None) or "hermes_bulk").split(".")[0]
        message = (f"Bulk cannot start: the Python package {missing!r} is not installed in Hermes' Python "
                   f"({sys.executable}). Install hermes-bulk there with:\n"
                   f"  {sys.executable} -m pip install hermes-bulk\n"
                   "then restart Hermes (and its gateway).")
        ctx.register_command("bulk", lambda raw_args="": message, description="Bulk (not installed correctly)")
        return
    bulk.register(ctx)
