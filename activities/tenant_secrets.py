"""A run's tenant's credentials: ``ctx.secret("NAME")`` in a tool, ``${secret:NAME}`` of a ``per_run`` MCP server.

The secret ``NAME`` of tenant ``T`` is the file ``AGENT_TENANT_SECRETS_DIR/T/NAME``: its contents, one
trailing newline dropped. That is the layout of a Kubernetes Secret mounted as a directory per tenant
(``NAME -> ..data/NAME -> ..2026_.../NAME``) or of one projected volume holding every tenant
(``T -> ..data/T``): links are followed, but a file whose real path leaves its tenant's directory (or
a tenant directory that leaves the secrets directory) is refused, so no link can hand a tenant
another's file. Only when the operator says so (``AGENT_TENANT_SECRETS_FALLBACK=1``) does a secret
the tenant lacks fall back to the worker's own environment variable of that name
(:meth:`Settings.worker_secret <activities.settings.Settings.worker_secret>`).

Every value handed out is learned by :mod:`activities.redaction` first, so it is redacted from the
tool's result, its error, log lines, history and the transcript in the store, whichever tenant it
belongs to. A refusal (:class:`SecretUnavailable`) names the secret, never its value nor a path.
"""

from __future__ import annotations

import os
import re
import stat
from pathlib import Path

from activities.redaction import MIN_LEARNED_CHARS, learn
from activities.settings import Settings

SECRET_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]{0,63}$")
MAX_SECRET_BYTES = 64 * 1024
SECRET_REFERENCE = re.compile(r"\$\{secret:([^}]*)\}")  # ``${secret:NAME}`` in an MCP server's env / headers


class SecretUnavailable(Exception):
    """The run cannot have this secret: its message names the secret (never a value or a path)."""


def check_name(name: str) -> str:
    """``name`` when it is a valid secret name; ``SecretUnavailable`` otherwise."""
    if not isinstance(name, str) or not SECRET_NAME.fullmatch(name):
        shown = repr(name[:64]) if isinstance(name, str) else type(name).__name__
        raise SecretUnavailable(
            f"secret name {shown} is not valid: use 1-64 letters, digits or '_', not starting with a digit"
        )
    return name


def _safe_tenant(tenant: str) -> bool:
    return tenant not in ("", ".", "..") and "/" not in tenant and "\0" not in tenant and "\\" not in tenant


def _within(path: str, root: str) -> bool:
    return path.startswith(root.rstrip(os.sep) + os.sep)


def tenant_secret(settings: Settings, tenant: str, name: str) -> str:
    """The run's tenant's secret ``name`` (else the worker's, when the operator allows it), learned for redaction.

    ``SecretUnavailable`` when the name is not valid, the secret is missing, or its file is not a regular file
    of at most ``MAX_SECRET_BYTES`` inside the tenant's directory.
    """
    check_name(name)
    value = _from_tenant(settings, tenant, name)
    if value is None and settings.tenant_secrets_fallback:
        value = settings.worker_secret(name)
    if value is None:
        whose = f"tenant {tenant!r}" if _safe_tenant(tenant) else "this run (it has no tenant)"
        raise SecretUnavailable(f"secret {name!r} is not configured for {whose}")
    if len(value) < MIN_LEARNED_CHARS:
        raise SecretUnavailable(f"secret {name!r} is shorter than {MIN_LEARNED_CHARS} characters, too short to redact")
    learn(value)
    return value


def _from_tenant(settings: Settings, tenant: str, name: str) -> str | None:
    """The file's value, None when the tenant has no such secret (or no secrets at all)."""
    base = settings.tenant_secrets_dir
    if not base or not _safe_tenant(tenant):
        return None
    root = os.path.realpath(base)
    tenant_dir = os.path.realpath(os.path.join(root, tenant))
    # A tenant's directory may be a link (a projected volume's ``T -> ..data/T``), never one to another tenant's.
    if not _within(tenant_dir, root) or os.path.basename(tenant_dir) != tenant or not os.path.isdir(tenant_dir):
        return None
    path = os.path.realpath(os.path.join(tenant_dir, name))
    if not _within(path, tenant_dir):
        raise SecretUnavailable(f"secret {name!r} links outside its tenant's directory; it is refused")
    try:
        # O_NOFOLLOW: the real path was checked; a link swapped in since is refused, not followed.
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise SecretUnavailable(f"secret {name!r} cannot be read ({exc.strerror or type(exc).__name__})") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise SecretUnavailable(f"secret {name!r} is not a regular file")
        if info.st_size > MAX_SECRET_BYTES:
            raise SecretUnavailable(f"secret {name!r} is larger than {MAX_SECRET_BYTES} bytes")
        data = os.read(fd, MAX_SECRET_BYTES + 1)
    finally:
        os.close(fd)
    if len(data) > MAX_SECRET_BYTES:
        raise SecretUnavailable(f"secret {name!r} is larger than {MAX_SECRET_BYTES} bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        raise SecretUnavailable(f"secret {name!r} is not UTF-8 text") from None
    return text[:-1] if text.endswith("\n") else text


def references(value: str) -> list[str]:
    """The names of the ``${secret:NAME}`` references in ``value``."""
    return SECRET_REFERENCE.findall(value)


def expand(value: str, settings: Settings, tenant: str) -> tuple[str, list[str]]:
    """``value`` with each ``${secret:NAME}`` replaced by the tenant's secret, and the values it used."""
    used: list[str] = []

    def replace(match: re.Match[str]) -> str:
        secret = tenant_secret(settings, tenant, match.group(1))
        used.append(secret)
        return secret

    return SECRET_REFERENCE.sub(replace, value), used


def visible_inside(directory: str, bound: list[str]) -> str:
    """The bound host path that ``directory`` lies under or holds (so a sandbox would see it), or ``""``."""
    real = os.path.realpath(directory)
    for path in bound:
        top = os.path.realpath(path)
        if real == top or _within(real, top) or _within(top, real):
            return path
    return ""


def secrets_dir_problem(settings: Settings, bound: list[str]) -> str:
    """Why ``AGENT_TENANT_SECRETS_DIR`` cannot be used (not a directory, or visible inside a sandbox), or ``""``."""
    base = settings.tenant_secrets_dir
    if not base:
        return ""
    if not Path(base).is_dir():
        return f"AGENT_TENANT_SECRETS_DIR={base}: not a directory"
    where = visible_inside(base, bound)
    if where:
        return (
            f"AGENT_TENANT_SECRETS_DIR={base}: lies under {where}, which every local sandbox sees: "
            "keep tenants' secrets outside the host paths the sandbox binds"
        )
    return ""
