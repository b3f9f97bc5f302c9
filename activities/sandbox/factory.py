"""Picks the sandbox backend named by ``AGENT_SANDBOX`` (one cached instance per name and root)."""

from __future__ import annotations

import threading
from pathlib import Path

from activities.config import Settings
from activities.sandbox.base import SandboxBackend, SandboxUnavailable
from activities.sandbox.local import LocalLimits, LocalSandboxBackend

BACKENDS = ("local", "e2b")

_lock = threading.Lock()
_cache: dict[tuple[str, Path], SandboxBackend] = {}


def backend_for(settings: Settings) -> SandboxBackend:
    """The backend for ``settings.sandbox``; :class:`SandboxUnavailable` for unknown or unimplemented ones.

    Cached so that every activity of a worker shares one backend (and the local
    backend's record of running commands, which ``kill`` uses).
    """
    name = settings.sandbox.strip().lower()
    if name == "e2b":
        raise SandboxUnavailable(
            "the e2b sandbox backend is not implemented yet (issue 5); "
            "unset AGENT_SANDBOX/E2B_API_KEY to use the local bubblewrap sandbox"
        )
    if name != "local":
        raise SandboxUnavailable(
            f"unknown sandbox backend AGENT_SANDBOX={settings.sandbox!r}; allowed: {', '.join(BACKENDS)}"
        )
    root = (Path(settings.state_dir) / "sandboxes").absolute()
    with _lock:
        backend = _cache.get((name, root))
        if backend is None:
            backend = _cache[(name, root)] = LocalSandboxBackend(root, LocalLimits.from_env())
        return backend
