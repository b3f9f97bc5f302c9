"""Picks the sandbox backend named by ``settings.sandbox.backend`` (one cached instance per configuration)."""

from __future__ import annotations

import hashlib
import threading
from pathlib import Path

from activities.sandbox.base import SandboxBackend, SandboxUnavailable
from activities.sandbox.local.backend import LocalSandboxBackend
from activities.settings import SANDBOX_BACKENDS, Settings

_lock = threading.Lock()
_cache: dict[tuple[str, ...], SandboxBackend] = {}


def backend_for(settings: Settings) -> SandboxBackend:
    """The backend for ``settings.sandbox``; :class:`SandboxUnavailable` for unknown or unusable ones.

    ``e2b`` without an ``E2B_API_KEY`` fails closed (never a silent fallback to local).

    Cached so that every activity of a worker shares one backend (the local
    backend's record of running commands, which ``kill`` uses; the E2B backend's
    map of logical ids to VMs).
    """
    config = settings.sandbox
    name = config.backend.strip().lower()
    if name == "e2b":
        from activities.extras import require

        require("e2b", "e2b", "AGENT_SANDBOX=e2b (the E2B sandbox)")
        key = config.e2b_api_key
        if key is None or not key.get_secret_value():
            raise SandboxUnavailable(
                "AGENT_SANDBOX=e2b needs E2B_API_KEY (the API key of your E2B team); "
                "unset AGENT_SANDBOX to use the local bubblewrap sandbox instead"
            )
        # cached per key, keyed by a digest so that the key itself is not kept twice
        cache_key = (name, hashlib.sha256(key.get_secret_value().encode()).hexdigest(), repr(config.e2b))
        with _lock:
            backend = _cache.get(cache_key)
            if backend is None:
                from activities.sandbox.e2b.backend import E2BSandboxBackend  # imports the e2b SDK

                backend = _cache[cache_key] = E2BSandboxBackend(key, config.e2b)
            return backend
    if name != "local":
        raise SandboxUnavailable(
            f"unknown sandbox backend AGENT_SANDBOX={config.backend!r}; allowed: {', '.join(SANDBOX_BACKENDS)}"
        )
    root = (Path(settings.state_dir) / "sandboxes").absolute()
    local_key = (name, str(root), repr(config.local))
    with _lock:
        backend = _cache.get(local_key)
        if backend is None:
            backend = _cache[local_key] = LocalSandboxBackend(root, config.local.limits, uid_base=config.local.uid_base)
        return backend
