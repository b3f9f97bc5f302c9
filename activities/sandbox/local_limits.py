"""What a local sandbox's commands may use, and which host uid a root worker runs them as.

Both come from the ``AGENT_SANDBOX_*`` environment: :meth:`LocalLimits.from_env` and
:func:`uid_base_from_env`.
"""

from __future__ import annotations

import hashlib
import os
from collections.abc import Mapping
from dataclasses import dataclass

DEFAULT_UID_BASE = 2_000_000_000
UID_SPAN = 1_000_000


@dataclass(frozen=True)
class LocalLimits:
    """Per-command resource limits; ``from_env`` reads the ``AGENT_SANDBOX_*`` overrides."""

    timeout_s: float = 60.0  # wall time; a run's own timeout_s is capped at this
    memory_mb: int = 1024  # RLIMIT_AS, per process
    cpu_s: int = 60  # RLIMIT_CPU, per process
    output_bytes: int = 64 * 1024  # kept per stream (stdout, stderr)
    fsize_mb: int = 64  # RLIMIT_FSIZE: largest file a command may write
    nofile: int = 256  # RLIMIT_NOFILE
    tmpfs_mb: int = 64  # size of the in-memory /tmp and /dev/shm
    nproc: int = 256  # RLIMIT_NPROC: processes + threads of the sandbox at once
    drain_bytes: int = 64 * 1024 * 1024  # output read (and dropped) per stream before the command is killed

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> LocalLimits:
        env = os.environ if env is None else env
        default = cls()

        def number(name: str, fallback: float) -> float:
            raw = env.get(name, "").strip()
            if not raw:
                return fallback
            try:
                value = float(raw)
            except ValueError:
                raise ValueError(f"{name}={raw!r} is not a number") from None
            if value <= 0:
                raise ValueError(f"{name}={raw!r} must be positive")
            return value

        return cls(
            timeout_s=number("AGENT_SANDBOX_TIMEOUT_S", default.timeout_s),
            memory_mb=int(number("AGENT_SANDBOX_MEMORY_MB", default.memory_mb)),
            cpu_s=int(number("AGENT_SANDBOX_CPU_S", default.cpu_s)),
            output_bytes=int(number("AGENT_SANDBOX_OUTPUT_BYTES", default.output_bytes)),
            fsize_mb=int(number("AGENT_SANDBOX_FSIZE_MB", default.fsize_mb)),
            nofile=int(number("AGENT_SANDBOX_NOFILE", default.nofile)),
            tmpfs_mb=int(number("AGENT_SANDBOX_TMPFS_MB", default.tmpfs_mb)),
            nproc=int(number("AGENT_SANDBOX_NPROC", default.nproc)),
        )


def uid_base_from_env(env: Mapping[str, str] | None = None) -> int:
    """``AGENT_SANDBOX_UID_BASE``: first host uid a root worker hands to sandboxes."""
    raw = (os.environ if env is None else env).get("AGENT_SANDBOX_UID_BASE", "").strip()
    if not raw:
        return DEFAULT_UID_BASE
    value = int(raw)
    if not 1000 <= value <= 4_000_000_000:
        raise ValueError(f"AGENT_SANDBOX_UID_BASE={raw!r} must be between 1000 and 4000000000")
    return value


def host_uid_for(sandbox_id: str, base: int) -> int:
    """The unprivileged host uid (= gid) a root worker runs ``sandbox_id``'s commands as."""
    digest = hashlib.sha256(sandbox_id.encode()).digest()
    return base + int.from_bytes(digest[:8], "big") % UID_SPAN


__all__ = ["DEFAULT_UID_BASE", "UID_SPAN", "LocalLimits", "host_uid_for", "uid_base_from_env"]
