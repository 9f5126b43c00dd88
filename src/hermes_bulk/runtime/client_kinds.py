"""The kinds of model client a `hermes-bulk` worker can serve beyond HERMES_BULK_*'s endpoint.

Each kind is an entry point in the `hermes_bulk.clients` group: a callable taking the Settings
and returning Served (the Hermes plugin declares one for jobs created with `/bulk`). The core
finds them by group, so it never names the package that provides them, and a worker serves a
kind only where that package is installed and can call its model.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from importlib.metadata import entry_points

from ..config.settings import Settings
from ..providers.pacing import RequestGate
from .worker import ClientFactory

GROUP = "hermes_bulk.clients"
NONE_NOTE = "serves only jobs created by hermes-bulk create"

log = logging.getLogger("hermes_bulk")


@dataclass(frozen=True)
class Served:
    """What one kind offers on this machine."""

    clients: dict[str, ClientFactory] = field(default_factory=dict)  #: job.spec.client -> factory
    note: str = ""  #: which jobs it serves here, or why none, for the worker's log
    #: The gate the calls of a worker serving these clients go through (the kind's budget); None:
    #: the machine's own.
    request_gate: RequestGate | None = None
    #: kind -> why this machine does not serve it (a kind that offered no clients, or failed to
    #: load)
    unserved: dict[str, str] = field(default_factory=dict)
    serving: list[str] = field(default_factory=list)  #: the notes of the kinds it serves


def served(settings: Settings) -> Served:
    """Every installed kind, together: their clients, their notes in one line, the first gate."""
    clients: dict[str, ClientFactory] = {}
    notes: list[str] = []
    unserved: dict[str, str] = {}
    serving: list[str] = []
    gate: RequestGate | None = None
    for entry in sorted(entry_points(group=GROUP), key=lambda e: e.name):
        try:
            offer: Served = entry.load()(settings)
        except Exception:  # a broken kind costs its jobs, not the worker
            log.warning("model-client kind %s could not be loaded", entry.name, exc_info=True)
            notes.append(
                f"does not serve {entry.name} jobs: that kind failed to load (see the log)"
            )
            unserved[entry.name] = notes[-1]
            continue
        clients.update(offer.clients)
        notes.append(offer.note)
        if offer.clients:
            serving.append(offer.note)
        else:
            unserved[entry.name] = offer.note
        gate = gate or (offer.request_gate if offer.clients else None)
    return Served(clients, "; ".join(n for n in notes if n) or NONE_NOTE, gate, unserved, serving)


def start_line(served: Served, running_kinds: dict[str, list[str]]) -> str:
    """What a `hermes-bulk worker` serves, for its start line. A kind it does not serve is named
    only when jobs of that kind are running on its backend (running_kinds: kind -> job ids), so
    a worker that never meets a job made in Hermes says nothing about Hermes."""
    parts = ["serves jobs created by hermes-bulk create"]
    parts += [note for note in served.serving if note]
    for kind, reason in sorted(served.unserved.items()):
        if running_kinds.get(kind):
            shown = ", ".join(running_kinds[kind][:3]) + (
                ", …" if len(running_kinds[kind]) > 3 else ""
            )
            parts.append(f"{reason} (running: {shown}, waiting for a worker that serves them)")
    return "; ".join(parts)
