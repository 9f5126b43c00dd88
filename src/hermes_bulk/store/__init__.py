"""The job store and shared limiter: one protocol (protocol.py), one module per backend."""

from .protocol import *  # noqa: F403 - the protocol's names are the package's public surface
