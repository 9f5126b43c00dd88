"""What Bulk reads of the Hermes profile it runs in: its home and name, the plugin's settings, the
configured model and the route its requests take, and the credentials to mask in logs.

Like plugin/hermes.py (which exposes these names too), each Hermes API here sits behind one
function pinned by tests/plugin/test_hermes_api.py, and Hermes is imported inside functions only.
Nothing here calls a model: that is ctx.llm, in hermes.py.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..config.settings import Settings
from ..redact import register_secret, register_url
from ..store.protocol import JobRecord

PLUGIN_ID = "bulk"  #: the entry-point name, the directory name and the plugins.entries key
CLIENT = "hermes"  #: job.spec.client of jobs whose items go through ctx.llm
_KEY_PREFIX = CLIENT + ":"


# Homes, settings, paths ------------------------------------------------------------------------


def profile_home() -> Path:
    """The active profile's home (a multiplexed gateway switches it per turn)."""
    from hermes_constants import get_hermes_home

    return Path(get_hermes_home())


def profile_name() -> str:
    """ "default", a profile's name, or "custom" when HERMES_HOME is somewhere else."""
    from hermes_cli.profiles import get_active_profile_name

    return get_active_profile_name()


def data_dir() -> Path:
    """Where Bulk keeps its data for this profile: <profile home>/plugin-data/bulk."""
    return profile_home() / "plugin-data" / PLUGIN_ID


def plugin_settings(ctx: Any = None) -> dict[str, Any]:
    """`plugins.entries.bulk.settings` from the profile's config.yaml.

    Newer Hermes gives plugins ctx.get_config(key, default); 0.19.0 does not, so there the
    profile's config is read directly (load_config follows the per-turn profile too).
    """
    get_config = getattr(ctx, "get_config", None)
    if callable(get_config):
        values = {name: get_config(name, None) for name in Settings.model_fields}
        return {k: v for k, v in values.items() if v is not None}
    from hermes_cli.config import load_config

    entry = ((load_config().get("plugins") or {}).get("entries") or {}).get(PLUGIN_ID) or {}
    settings = entry.get("settings") if isinstance(entry, dict) else None
    return dict(settings) if isinstance(settings, dict) else {}


def working_directory() -> Path:
    """What relative paths in a command are relative to: Hermes' terminal cwd, as its tools use."""
    return Path(os.environ.get("TERMINAL_CWD") or os.getcwd())


@contextlib.contextmanager
def in_profile(home: Path | None) -> Iterator[None]:
    """Run Hermes calls as the profile `home`, also on a worker thread.

    A multiplexed gateway sets the profile per turn in a context variable that threads started
    elsewhere do not see; the workers set it back for each ctx.llm call of a job.
    """
    if home is None:
        yield
        return
    from hermes_constants import reset_hermes_home_override, set_hermes_home_override

    token = set_hermes_home_override(str(home))
    try:
        yield
    finally:
        reset_hermes_home_override(token)


# The model ---------------------------------------------------------------------------------------


@dataclass(frozen=True)
class HermesModel:
    """The profile's configured main model, which ctx.llm calls (no credentials)."""

    profile: str
    provider: str
    model: str
    base_url: str = ""
    configured_api_mode: str = ""  #: model.api_mode, as config.yaml has it ("" when unset)

    def route(self) -> tuple[str, str]:
        """(provider, API mode) of a request to this model, as the budget records it."""
        return self.provider or "auto", api_mode(
            self.provider, self.base_url, self.configured_api_mode
        )

    @property
    def provider_key(self) -> str:
        """Groups workers on one provider quota, so a 429 makes them wait together."""
        return f"{_KEY_PREFIX}{self.profile}:{self.provider}:{self.model}"

    @property
    def configured(self) -> bool:
        return bool(self.provider or self.model)


def configured_model() -> HermesModel:
    """model.provider and model.default from the profile's config.yaml ("" when unset)."""
    from hermes_cli.config import load_config

    section = load_config().get("model")
    if isinstance(section, str):
        return HermesModel(profile_name(), "", section.strip())
    section = section if isinstance(section, dict) else {}
    provider = str(section.get("provider") or "").strip().lower()
    model = str(section.get("default") or section.get("model") or "").strip()
    return HermesModel(
        profile_name(),
        provider,
        model,
        base_url=str(section.get("base_url") or "").strip(),
        configured_api_mode=str(section.get("api_mode") or "").strip().lower(),
    )


def provider_of(provider_key: str) -> str:
    """The Hermes provider a job created in Hermes was created for, from its provider key."""
    parts = provider_key.split(":", 3)
    return parts[2] if len(parts) == 4 and parts[0] + ":" == _KEY_PREFIX else ""


def request_route(job: JobRecord) -> tuple[str, str]:
    """(provider, API mode) of a request of a job created in Hermes, as the cron budget records
    it and as Hermes records its chat: the provider the job was created for, and the wire
    protocol Hermes speaks to it (api_mode) with the base URL and api_mode configured for that
    provider. A job of Bulk's own endpoint: its protocol (budget.gate.route_of)."""
    from ..budget.gate import route_of

    if job.spec.client != CLIENT:
        return route_of(job)
    provider = provider_of(job.spec.provider_key)
    try:
        model = configured_model()
    except Exception:  # a config Hermes cannot read: the provider's own transport
        model = HermesModel("", provider, "")
    if model.provider != provider:  # configured since for another provider: not its URL
        model = HermesModel(model.profile, provider, "")
    return model.route()


def api_mode(provider: str, base_url: str = "", configured: str = "") -> str:
    """The API mode Hermes uses for a provider, as hermes_cli.providers.determine_api_mode
    decides it, without its models.dev lookup (a catalog fetch over the network; the transport
    comes from Hermes' own overlays anyway): the URL's mandated mode, then a custom endpoint's
    configured one, then the provider's transport, else chat completions. "unknown" when this
    Hermes has no such table."""
    try:
        from hermes_cli import providers
    except Exception:
        return "unknown"
    mandated = providers.host_mandated_api_mode(base_url) if base_url else None
    if mandated:
        return mandated
    if configured in providers.TRANSPORT_TO_API_MODE.values():
        return configured
    overlay = providers.HERMES_OVERLAYS.get(providers.normalize_provider(provider or ""))
    if overlay is not None:
        return providers.TRANSPORT_TO_API_MODE.get(overlay.transport, "chat_completions")
    return "bedrock_converse" if provider == "bedrock" else "chat_completions"


def register_model_secrets() -> None:
    """Mask Hermes' provider credentials by value in our logs: a provider may echo its key.

    The profile's model.api_key and model.base_url, and the *_API_KEY variables Hermes loaded
    from the profile's .env (where its providers' keys live). Read, not resolved: resolving a
    provider can refresh OAuth tokens, which a plugin must not trigger.
    """
    with contextlib.suppress(Exception):  # a config Hermes cannot read leaves shapes to do it
        from hermes_cli.config import load_config

        section = load_config().get("model")
        if isinstance(section, dict):
            register_secret(str(section.get("api_key") or ""))
            register_url(str(section.get("base_url") or ""))
    for name, value in os.environ.items():
        if (
            name.endswith(("_API_KEY", "_TOKEN")) and len(value) >= 12
        ):  # not flags like USE_TOKEN=true
            register_secret(value)


def profile_of(provider_key: str) -> str | None:
    """The Hermes profile a job was created in, from its provider key."""
    if not provider_key.startswith(_KEY_PREFIX):
        return None
    return provider_key[len(_KEY_PREFIX) :].split(":", 1)[0]
